"""Where SigLIP's training starts, and whether that decides a seed that does not train (issue #30, item 4).

    python -m benchmarks.quality.siglip_start --runs 0:-5 4:-5 4:-1.6 0:-8.4 --workdir runs/siglip_start \
        --out benchmarks/results/siglip_start

In the main job SigLIP (t learned from 10, b learned from −5) fails on one seed of five. The demo's towers start
nearly collapsed: before any step, the captions of a batch embed almost onto one direction and the images onto
another, and the cosine between the two, m, is set by the seed's initial weights. SigLIP's logit is z = t·s + b, so
every pair starts near z0 = t·m + b. This study measures, per seed, m (the mean cosine of the first training batch's
caption × image pairs, with the model built exactly as ``ce-retrieval train`` builds it: a fresh process per seed,
the trainer's own calls up to the model) and the within-tower mean cosines; then trains SigLIP from each requested
(seed, initial b) and evaluates it on the **validation split only** (``demo_scale.run_one``), at the demo's budget
(500 steps at batch 64). Swapping starts (the failing seed from the b that puts its z0 where a training seed's is,
and the other way round) separates "where it starts" from "which seed it is".

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import time

from benchmarks import ROOT
from benchmarks.common.machine import cpu_name, load_average
from benchmarks.common.records import write_record
from benchmarks.quality.demo_scale import CONFIG, overrides, run_one

LOSS = "SigmoidLoss"

# The child: the trainer's calls up to the compiled model (seeding point first), then the first training batch.
CHILD = """
import json, os, sys
import numpy as np
from ce_retrieval import configs, data
from ce_retrieval.cli.train import resolve_config
from ce_retrieval.tasks import RetrievalTask
from ce_retrieval.training.trainer import prepare_process
cfg = configs.load_experiment(resolve_config(sys.argv[1]), [sys.argv[2]])
strategy, _ = prepare_process(cfg)
task = RetrievalTask(cfg)
task.build_loss()
vocab = data.vocab_path_for(cfg.data, sys.argv[3])
dataset = task.build_dataset()
with strategy.scope():
    model = task.build_compiled_model(vocab, task.steps_per_epoch() * cfg.train.epochs)
batch = next(iter(dataset))
unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
t = unit(model.text_encoder(batch["caption"]).numpy())
v = unit(model.image_encoder(batch["image"]).numpy())
ids = batch["image_id"].numpy()
pos, off = ids[:, None] == ids[None, :], ~np.eye(len(t), dtype=bool)
s = t @ v.T
print(json.dumps({"m": float(s.mean()), "positive_mean": float(s[pos].mean()), "negative_mean": float(s[~pos].mean()),
                  "pair_std": float(s.std()), "text_text": float((t @ t.T)[off].mean()),
                  "image_image": float((v @ v.T)[off].mean()), "logit_scale": float(model.logit_scale)}))
"""


def initial_statistics(seed: int, workdir: pathlib.Path) -> dict:
    """The seed's initial cosines (module docstring), from a fresh process."""
    out = workdir / "initial" / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, CONFIG, overrides(LOSS, -5.0, seed), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    if done.returncode:
        raise SystemExit(f"seed {seed}: measuring the initial model failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(record: dict) -> str:
    lines = [
        "# Where SigLIP's training starts, per seed (the main job, validation split)",
        "",
        f"    {record['command']}",
        "",
        f"Date {record['date']}; {record['cpu']}, 2 cores; load average (1, 5, 15 min) start "
        f"{record['load']['start']}, end {record['load']['end']}; {record['minutes']:.1f} min. "
        "Demo config (500 steps at batch 64 from scratch), "
        "SigLIP with t learned from 10 and b learned from the value in the table; every figure on the validation split "
        "(2,500 captions × 500 images), the test split is not read. m: mean cosine of the first training batch's "
        "64 × 64 caption × image pairs before any step; text × text, image × image: the mean cosine between different "
        "items of one tower (1 = all on one direction); z0 = t·m + b, the mean initial logit.",
        "",
        "| seed | m | text × text | image × image | initial b | z0 | val text→image R@1 (%) | val PR-AUC (%) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in record["runs"]:
        init, summary = record["initial"][str(row["seed"])], row["result"]["summary"]
        lines.append(
            f"| {row['seed']} | {init['m']:+.3f} | {init['text_text']:.3f} | {init['image_image']:.3f} | "
            f"{row['bias']:+.1f} | {row['z0']:+.2f} | {100 * summary['t2i_r1']:.1f} | {100 * summary['pr_auc']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", nargs="+", default=["0:-5", "4:-5", "4:-1.6", "0:-8.4"], help="SEED:INITIAL_B ...")
    p.add_argument("--workdir", default="runs/siglip_start")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "siglip_start"))
    args = p.parse_args(argv)
    command = "python -m benchmarks.quality.siglip_start " + " ".join(sys.argv[1:] if argv is None else argv)
    workdir = pathlib.Path(args.workdir)
    runs = [(int(seed), float(bias)) for seed, bias in (r.split(":") for r in args.runs)]
    load_start, start = load_average(), time.perf_counter()
    initial = {str(seed): initial_statistics(seed, workdir) for seed in dict.fromkeys(seed for seed, _ in runs)}
    rows = []
    for seed, bias in runs:
        init = initial[str(seed)]
        result = run_one(LOSS, bias, seed, workdir, None)
        rows.append({"seed": seed, "bias": bias, "z0": init["logit_scale"] * init["m"] + bias, "result": result})
    record = {
        "command": command.strip(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_name(),
        "load": {"start": load_start, "end": load_average()},
        "minutes": (time.perf_counter() - start) / 60,
        "initial": initial,
        "runs": rows,
    }
    out = pathlib.Path(args.out)
    write_record(str(out.parent), out.name, record, markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
