"""Train-step time of the main job with its images decoded by the input pipeline, against decoding them in the step,
in one process.

The training pipeline now hands the train step decoded pixels (``RetrievalTask.build_dataset``: the synthetic set's
images decoded once, up front, by the image tower's own ``decode_image``; a streamed source's per example in tf.data's
threads). The baseline is the former pipeline, which carried the encoded bytes and left the decoding to the tower's
``ImageDecoder`` inside every step (``tf.map_fn``, one image at a time). Both kinds train the demo config's model from
the same seed on the same batches, alternating ABBA; each model is built and traced anew, takes ``--warmup`` steps,
then ``--steps`` timed steps. Reported: the median ms per step of each kind, and whether the two kinds trained the
same weights bit for bit (they must: the same ops decode the same bytes).

    python -m benchmarks.scale.decode_in_pipeline      # writes benchmarks/results/decode_in_pipeline.{json,md}

Measure alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import statistics
import sys
import tempfile
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow loads

from benchmarks import ROOT  # noqa: E402
from benchmarks.common.ab import abba, add_config_arguments, load_config  # noqa: E402
from benchmarks.common.machine import load_average, machine_info  # noqa: E402
from benchmarks.common.records import write_record  # noqa: E402

KINDS = ("decoded by the pipeline", "decoded in the step")


def time_steps(task, dataset, vocab_path: str, warmup: int, steps: int) -> dict:
    """A freshly built, seeded model: ``warmup`` steps (the trace), then ``steps`` timed ones; ms/step and weights."""
    import numpy as np

    from ce_retrieval.utils.seeding import seed_everything

    cfg = task.config
    seed_everything(cfg.train.seed, deterministic=cfg.train.deterministic)
    model = task.build_compiled_model(vocab_path, total_steps=warmup + steps)
    step = model.make_train_function()
    iterator = iter(dataset)
    for _ in range(warmup):
        step(iterator)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        logs = step(iterator)
        float(logs["loss"])  # wait for the step
        times.append(time.perf_counter() - start)
    weights = b"".join(np.asarray(w).tobytes() for w in model.get_weights())
    digest = hashlib.sha256(weights).hexdigest()[:16]
    return {"ms_per_step": round(1000 * statistics.median(times), 1), "weights_sha256": digest}


def summarise(runs: list[dict]) -> dict:
    median = {k: statistics.median(r["ms_per_step"] for r in runs if r["kind"] == k) for k in KINDS}
    return {
        "median_ms_per_step": median,
        "speedup": round(median["decoded in the step"] / median["decoded by the pipeline"], 2),
        "same_weights": len({r["weights_sha256"] for r in runs}) == 1,
    }


def markdown(record: dict) -> str:
    s, m = record["summary"], record["machine"]
    lines = [
        f"# The main job's train step: images decoded by the input pipeline against in the step ({record['date']})",
        "",
        f"    {record['command']}",
        "",
        f"{m['cpu']}, {m['cores']} cores; load average (1, 5, 15 min) before {record['load_before']}, after "
        f"{record['load_after']} (the run's own threads, nothing else running). Config {record['config']}, global "
        f"batch {record['batch_size']}; each run builds and traces its model from seed {record['seed']}, takes "
        f"{record['warmup']} warm-up steps, then {record['steps']} timed ones; kinds alternate ABBA.",
        "",
        "| kind | median ms per step | ms per step in each run | weights (sha256, first 16) |",
        "|---|---:|---|---|",
    ]
    for kind in KINDS:
        runs = [r for r in record["runs"] if r["kind"] == kind]
        each = ", ".join(f"{r['ms_per_step']:.1f}" for r in runs)
        lines.append(f"| {kind} | {s['median_ms_per_step'][kind]:.1f} | {each} | {runs[0]['weights_sha256']} |")
    lines += [
        "",
        f"Speed-up of the step (in the step / by the pipeline): {s['speedup']}×. The same weights from every run: "
        f"{s['same_weights']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_arguments(ap)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each kind (ABBA pairs)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--name", default="decode_in_pipeline")
    args = ap.parse_args(argv)
    command = "python -m benchmarks.scale.decode_in_pipeline " + " ".join(sys.argv[1:] if argv is None else argv)

    from ce_retrieval import data
    from ce_retrieval.tasks.retrieval import RetrievalTask
    from ce_retrieval.training.trainer import prepare_process

    cfg, config_label = load_config(args)
    prepare_process(cfg)
    task = RetrievalTask(cfg)
    datasets = {  # built anew for every run: a seeded shuffle reshuffles for each new iterator of one dataset
        "decoded by the pipeline": task.build_dataset,
        "decoded in the step": lambda: data.train_pipeline(cfg.data, "train", cfg.train.batch_size, cfg.train.seed),
    }
    load_before = load_average()
    order = abba(KINDS, args.repeats)
    with tempfile.TemporaryDirectory() as workdir:
        vocab_path = data.vocab_path_for(cfg.data, workdir)
        runs = [{"kind": k, **time_steps(task, datasets[k](), vocab_path, args.warmup, args.steps)} for k in order]
    record = {
        "command": command.strip(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info([]),
        "load_before": load_before,
        "load_after": load_average(),
        "config": config_label,
        "batch_size": cfg.train.batch_size,
        "seed": cfg.train.seed,
        "warmup": args.warmup,
        "steps": args.steps,
        "runs": runs,
        "summary": summarise(runs),
    }
    write_record(args.out, args.name, record, markdown(record))
    return 0 if record["summary"]["same_weights"] else 1


if __name__ == "__main__":
    sys.exit(main())
