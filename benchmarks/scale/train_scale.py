"""The demo two-tower model trained from the config at large global batches on CPU (issue #22): peak memory and time
per example of the real train step, against batch 4,096.

Each configuration runs in its own process (its peak RSS is its own: ``VmHWM``) through the code of
``ce-retrieval train``: ``configs/synthetic_demo.yaml`` + ``--params_override``-style overrides
(``train.batch_size``, ``train.loss_tile_size``, ``train.loss_partition``, ``train.embedding_chunk``,
``train.strategy``) -> ``training.prepare_process`` (strategy, precision policy, seeds, op determinism) ->
``RetrievalTask.build_compiled_model`` in the strategy scope (towers, retrieval objective, both optimizers) ->
the model's compiled train function (``make_train_function``, what ``fit`` calls) on one synthetic in-memory batch
(random captions; random colour-block JPEGs; 5 captions per image id, as the demo data), distributed as ``fit``
distributes a dataset. The step is traced first (timed alone), then the first step runs (graph optimisation +
one step), then ``--steps`` timed steps. After tracing, the loss path the objective took is read from it
(``RetrievalObjective.last_path``) and must be the configuration's, so the benchmark cannot measure another path.

Configurations (``--runs``, default ``a,b,c``):

* ``a`` baseline: global batch ``--baseline_batch`` (4,096), tiled loss (``--tile``) + gradient cache (``--chunk``);
* ``b`` large: global batch ``--large_batch`` (65,536), tiled + gradient cache (``--large_chunk``); one step costs
  minutes here, so ``--large_steps 0`` (the default) measures the first step only, reported as such;
* ``c`` replicas: global batch ``--replica_batch`` (16,384) over ``--replicas`` (4) logical CPU replicas
  (``train.strategy: mirrored``), ``loss_partition: sharded`` + tiled + gradient cache (``--replica_chunk`` rows
  per replica);
* ``d`` reference: global batch ``--baseline_batch``, dense loss, plain step (no gradient cache).

    python -m benchmarks.scale.train_scale        # a, b, c at full size, alone on the machine: ~12 min (estimated)
    python -m benchmarks.scale.train_scale --runs a,b,c --baseline_batch 256 --large_batch 512 --replica_batch 128 \\
        --replicas 2 --tile 64 --chunk 64 --large_chunk 128 --replica_chunk 32 --out /tmp/ts   # smoke size

Memory: gradient caching bounds the towers' activations to one chunk, but the step decodes and augments the whole
replica batch before chunking (``TwoTowerModel._prepare``): 64x64x3 float32 pixels are 48 KiB a row, twice with the
augmented copy (about 6.4 GB at 65,536), and the unrolled chunk loop's graph grows with the number of chunks. A run
the machine cannot hold is recorded as failed (rc -9), with the others' figures.

Writes ``--out``/train_scale.json and train_scale.md (default ``benchmarks/results/``): the command, the machine
(CPU model, cores), the load average sampled during the run and the date. Exit status 1 when a run failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow loads, in the child processes too
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import ROOT
from benchmarks.common.machine import LoadSampler, machine_info, run_module  # noqa: E402  (no TensorFlow in the parent)
from benchmarks.common.records import write_record  # noqa: E402

DEMO_CONFIG = os.path.join(ROOT, "configs", "synthetic_demo.yaml")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
WORDS = "a the red green blue yellow dog cat car tree grass street small big sky on in with left right of".split()
IMAGES = 256  # distinct JPEGs, cycled over the image ids
# Rough costs on 2 idle cores for the printed estimate: benchmarks/results/gradcache.md (4.4 ms per example for the
# cached demo step at 4,096), tiled.md (11 s for the tiled loss at N = 32,768 under XLA, quadratic in N; this step
# is not XLA-compiled and adds the tiled recall@1 pass, hence 15 s); start-up, and tracing + graph optimisation per
# chunk (each chunk's towers are traced twice, per replica) from smoke runs at batch 512-2,048 under load 5-7, scaled
# down. Check them against the record.
EST = {"start_s": 25.0, "ms_per_example": 4.4, "loss_s_at_32768": 15.0, "trace_s_per_chunk": 0.8}


@dataclasses.dataclass(frozen=True)
class Run:
    """One configuration: what the overrides set and the loss path the objective must take."""

    key: str
    label: str
    batch: int
    chunk: int  # rows per replica per chunk; 0: plain step
    tile: int | str  # train.loss_tile_size: 0 dense, T, or "auto"
    partition: str = "replicated"
    replicas: int = 1  # 1: the default strategy
    steps: int = 1  # timed steps after the first
    expect: str = "tiled"  # LossPath.name the objective must take

    def overrides(self) -> str:
        items = [
            f"train.batch_size={self.batch}",
            f"train.loss_tile_size={self.tile}",
            f"train.loss_partition={self.partition}",
            f"train.embedding_chunk={self.chunk}",
        ]
        if self.replicas > 1:
            items += ["train.strategy=mirrored", f"train.num_cpu_replicas={self.replicas}"]
        return ",".join(items)

    def estimate_s(self) -> float:
        """Seconds on 2 idle cores (``EST``): start-up, tracing, the first step and the timed steps."""
        chunks = self.batch // self.replicas // self.chunk if self.chunk else 1
        trace = EST["trace_s_per_chunk"] * chunks * self.replicas
        step = self.batch * EST["ms_per_example"] / 1e3 + EST["loss_s_at_32768"] * (self.batch / 32768) ** 2
        return EST["start_s"] + trace + step * (1 + self.steps)


def plan(args) -> list[Run]:
    """The configurations of ``--runs``."""
    runs = {
        "a": Run("a", "baseline: tiled + gradient cache", args.baseline_batch, args.chunk, args.tile, steps=args.steps),
        "b": Run(
            "b", "large: tiled + gradient cache", args.large_batch, args.large_chunk, args.tile, steps=args.large_steps
        ),
        "c": Run(
            "c",
            f"{args.replicas} replicas: sharded + tiled + gradient cache",
            args.replica_batch,
            args.replica_chunk,
            args.tile,
            "sharded",
            args.replicas,
            args.steps,
            "sharded + tiled",
        ),
        "d": Run("d", "reference: dense, plain step", args.baseline_batch, 0, 0, steps=args.steps, expect="dense"),
    }
    keys = [k for k in args.runs.split(",") if k]
    unknown = [k for k in keys if k not in runs]
    if unknown:
        raise SystemExit(f"--runs: unknown configuration(s) {unknown}; choose from {sorted(runs)}")
    return [runs[k] for k in keys]


# ---- the child: one configuration in this process ----------------------------------------------------------------


def _memory_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MB (``/proc/self/status``; ``ru_maxrss`` for the peak elsewhere)."""
    fields = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = float(value.split()[0]) / 1024.0
    except OSError:
        pass
    peak = fields.get("VmHWM", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    return fields.get("VmRSS", peak), peak


def synthetic_dataset(rows: int, image_size: int, captions_per_image: int, seed: int = 0):
    """One global batch of ``rows`` (caption, JPEG, image id) rows, batched as the training pipeline batches
    (``drop_remainder=True``: static shapes) and repeated."""
    import numpy as np
    import tensorflow as tf

    from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID

    rng = np.random.default_rng(seed)
    block = np.ones((max(image_size // 8, 1), max(image_size // 8, 1), 1), np.uint8)
    jpegs = [
        tf.io.encode_jpeg(np.kron(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), block)).numpy()
        for _ in range(IMAGES)
    ]
    ids = np.arange(rows, dtype=np.int64) // captions_per_image
    batch = {
        CAPTION: [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 13)))) for _ in range(rows)],
        IMAGE: [jpegs[i % IMAGES] for i in ids],
        IMAGE_ID: ids,
    }
    return tf.data.Dataset.from_tensor_slices(batch).batch(rows, drop_remainder=True).repeat()


def _step(train_function, iterator) -> tuple[float, dict]:
    start = time.perf_counter()
    logs = {k: float(v) for k, v in train_function(iterator).items()}  # float(): waits for the step
    return time.perf_counter() - start, logs


def run_child(run: Run, config: str, extra: list[str]) -> dict:
    """Builds the model from the config, traces and runs its train step; the record of one configuration."""
    from ce_retrieval import configs, training
    from ce_retrieval.tasks import RetrievalTask

    cfg = configs.load_experiment(config, [run.overrides(), *extra])
    strategy, policy = training.prepare_process(cfg)  # first: may split the CPU into logical devices
    task = RetrievalTask(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "vocab.txt")
        with open(vocab, "w") as f:
            f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
        with strategy.scope():
            model = task.build_compiled_model(vocab, (cfg.train.steps_per_epoch or 100) * cfg.train.epochs)
        rss_built, _ = _memory_mb()
        data = synthetic_dataset(cfg.train.batch_size, cfg.model.image.image_size, cfg.data.captions_per_image)
        iterator = iter(strategy.experimental_distribute_dataset(data))
        train_function = model.make_train_function()
        start = time.perf_counter()
        train_function.get_concrete_function(iterator)
        trace_s = time.perf_counter() - start
        path = model.objective.last_path
        if path is None or path.name != run.expect or path.rows != cfg.train.batch_size:
            got = f"{path.name} at {path.rows} rows" if path else "no path (the objective was not called)"
            want = f"{run.expect} at {cfg.train.batch_size} rows"
            raise RuntimeError(f"run {run.key}: the objective took {got}, expected {want}")
        first_s, logs = _step(train_function, iterator)
        _, peak_first = _memory_mb()
        times = []
        for _ in range(run.steps):
            seconds, logs = _step(train_function, iterator)
            times.append(seconds)
        traces = train_function.experimental_get_tracing_count()  # 1: the first step ran the timed trace
    rss, peak = _memory_mb()
    step_s = sorted(times)[len(times) // 2] if times else None
    return {
        **dataclasses.asdict(run),
        "overrides": [run.overrides(), *extra],
        "describe": task.describe(model, strategy),
        "path": str(path),
        "path_name": path.name,
        "tile_size": path.tile,
        "num_replicas": strategy.num_replicas_in_sync,
        "chunks_per_replica": cfg.train.batch_size // strategy.num_replicas_in_sync // run.chunk if run.chunk else 0,
        "policy": policy,
        "rss_after_build_mb": round(rss_built, 1),
        "peak_rss_after_first_step_mb": round(peak_first, 1),
        "peak_rss_mb": round(peak, 1),
        "trace_s": round(trace_s, 2),
        "traces": traces,
        "first_step_s": round(first_s, 2),
        "step_s": None if step_s is None else round(step_s, 3),
        "step_times_s": [round(t, 3) for t in times],
        "ms_per_example": round(1e3 * (step_s if step_s is not None else first_s) / run.batch, 3),
        "ms_per_example_from": "timed steps (median)" if times else "first step (graph optimisation + one step)",
        "loss": logs["loss"],
        "loss_finite": math.isfinite(logs["loss"]),
        "in_batch_recall_at_1": logs.get("in_batch_recall_at_1"),
    }


# ---- the parent: one process per configuration, the record --------------------------------------------------------


def _child(run: Run, config: str, extra: list[str], timeout: float | None) -> dict:
    spec = json.dumps({"run": dataclasses.asdict(run), "config": config, "extra": extra})
    start = time.perf_counter()
    try:
        proc = run_module(__spec__.name, "--_child", spec, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**dataclasses.asdict(run), "failed": f"timed out after {timeout:.0f} s"}
    wall = round(time.perf_counter() - start, 1)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        why = f"rc {proc.returncode} (-9: killed, e.g. out of memory)"
        return {**dataclasses.asdict(run), "failed": why, "stderr_tail": proc.stderr[-1500:], "wall_s": wall}
    return {**json.loads(lines[-1]), "wall_s": wall}


def compare(results: list[dict]) -> dict:
    """Each run against the baseline ``a`` (when it ran): peak RSS and ms per example, as ratios."""
    base = next((r for r in results if r["key"] == "a" and "failed" not in r), None)
    if base is None:
        return {}
    out = {}
    for r in results:
        if r["key"] == "a" or "failed" in r:
            continue
        out[r["key"]] = {
            "peak_rss_ratio": round(r["peak_rss_mb"] / base["peak_rss_mb"], 2),
            "peak_rss_above_build_ratio": round(
                (r["peak_rss_mb"] - r["rss_after_build_mb"]) / max(base["peak_rss_mb"] - base["rss_after_build_mb"], 1),
                2,
            ),
            "ms_per_example_ratio": round(r["ms_per_example"] / base["ms_per_example"], 2),
            "first_step_ms_per_example_ratio": round(
                (r["first_step_s"] / r["batch"]) / (base["first_step_s"] / base["batch"]), 2
            ),
            "ms_per_example_basis": f"{r['ms_per_example_from']} vs {base['ms_per_example_from']}",
        }
    return out


def markdown(record: dict) -> str:
    """The record as a short Markdown page."""
    m = record["machine"]
    lines = [
        "# Demo train step at scale, from the config (issue #22)",
        "",
        f"Date: {m['date']}. Machine: {m['cpu']}, {m['cores']} cores; load average (1 min) during the run "
        f"{m['load_min']:.2f}–{m['load_max']:.2f} (samples {', '.join(str(x) for x in m['load_samples'])}). "
        f"Wall time {record['minutes']:.1f} min.",
        "",
        f"    {record['command']}",
        "",
        "`configs/synthetic_demo.yaml` plus each run's overrides, built as `ce-retrieval train` builds it; one "
        "synthetic in-memory batch; each run in its own process. Peak = the process's peak RSS (VmHWM). ms per "
        "example: median of the timed steps, or the first step (graph optimisation + one step) where none was timed.",
        "",
        "| run | global batch | replicas | loss path (from the objective) | chunk rows | peak RSS MB | RSS after build "
        "MB | trace s | first step s | step s | ms per example | loss |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in record["runs"]:
        if "failed" in r:
            failed = f"| {r['key']}: {r['label']} | {r['batch']:,} | {r['replicas']} | {r['expect']} | {r['chunk']} |"
            lines.append(failed + f" failed: {r['failed']} | | | | | | |")
            continue
        step = f"{r['step_s']:.2f}" if r["step_s"] is not None else "not timed"
        basis = "" if r["step_s"] is not None else " (first step)"
        lines.append(
            f"| {r['key']}: {r['label']} | {r['batch']:,} | {r['num_replicas']} | {r['path']} | {r['chunk'] or '-'} | "
            f"{r['peak_rss_mb']:,.0f} | {r['rss_after_build_mb']:,.0f} | {r['trace_s']:.1f} | {r['first_step_s']:.1f} "
            f"| {step} | {r['ms_per_example']:.2f}{basis} | {r['loss']:.4f} |"
        )
    for key, c in record["against_baseline"].items():
        lines.append("")
        lines.append(
            f"Run {key} against a: peak RSS ×{c['peak_rss_ratio']} (above the built model ×"
            f"{c['peak_rss_above_build_ratio']}), ms per example ×{c['ms_per_example_ratio']} "
            f"({c['ms_per_example_basis']}), first step per example ×{c['first_step_ms_per_example_ratio']}."
        )
    return "\n".join(lines) + "\n"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", default="a,b,c", help="configurations: a baseline, b large, c replicas, d dense plain")
    p.add_argument("--config", default=DEMO_CONFIG, help="the experiment YAML (default: the demo's)")
    p.add_argument("--override", action="append", default=[], help="more 'a.b=v,...' overrides for every run")
    p.add_argument("--tile", default="512", help="train.loss_tile_size of the tiled runs (T or auto)")
    p.add_argument("--baseline_batch", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=256, help="train.embedding_chunk of run a")
    p.add_argument("--large_batch", type=int, default=65536)
    p.add_argument("--large_chunk", type=int, default=1024, help="train.embedding_chunk of run b")
    p.add_argument("--replica_batch", type=int, default=16384)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--replica_chunk", type=int, default=512, help="train.embedding_chunk of run c (per replica)")
    p.add_argument("--steps", type=int, default=1, help="timed steps after the first, runs a, c, d")
    p.add_argument("--large_steps", type=int, default=0, help="timed steps after the first, run b (0: first only)")
    p.add_argument("--timeout", type=float, default=0, help="seconds per run (0: none)")
    p.add_argument("--out", default=RESULTS, help="folder of train_scale.json and train_scale.md")
    p.add_argument("--_child", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.tile = args.tile if args.tile == "auto" else int(args.tile)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args._child:
        spec = json.loads(args._child)
        print(json.dumps(run_child(Run(**spec["run"]), spec["config"], spec["extra"])), flush=True)
        return 0
    runs = plan(args)
    estimate = sum(r.estimate_s() for r in runs) / 60
    print(f"[train_scale] {', '.join(r.key for r in runs)}: estimated {estimate:.0f} min on 2 idle cores", flush=True)
    start, loads = time.perf_counter(), []
    sampler = LoadSampler(loads, every=30.0)
    sampler.start()
    results = []
    try:
        for run in runs:
            print(f"[train_scale] {run.key}: {run.label}, batch {run.batch:,} ({run.overrides()})", flush=True)
            results.append(_child(run, args.config, args.override, args.timeout or None))
            print(f"  {json.dumps(results[-1])}", flush=True)
    finally:
        sampler.stop.set()
    argv = sys.argv[1:] if argv is None else argv
    record = {
        "benchmark": "train_scale",
        "command": "python -m benchmarks.scale.train_scale " + " ".join(argv),
        "machine": machine_info(loads),
        "minutes": round((time.perf_counter() - start) / 60, 2),
        "estimate_minutes": round(estimate, 1),
        "runs": results,
        "against_baseline": compare(results),
    }
    write_record(args.out, "train_scale", record, markdown(record))
    return 1 if any("failed" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
