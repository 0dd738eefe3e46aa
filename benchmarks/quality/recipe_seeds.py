"""Candidate recipes against Sampled Softmax on the demo config, paired over train seeds (issue 21, part 3).

    nice python -m benchmarks.quality.recipe_seeds --seeds 0 1 2 3 4 --workers 2 \
        --candidate "CE-bidir=loss.bidirectional=true" --baseline_dir /tmp/r24 --out benchmarks/results/recipe_demo

Each candidate is ``name=override[,override...]`` (``--params_override`` of ``ce-retrieval train`` on config
synthetic_demo, plus ``train.seed=S``). Every (candidate, seed) trains in its own process
(``<workdir>/<name>/seed<S>``, reused when its ``eval/eval_test.json`` exists), then ``ce-retrieval evaluate
--split test --no_plots`` (no distractors). The baseline is read from a ``benchmarks/quality/demo_seeds.py`` workdir
(``<baseline_dir>/seed<S>/eval/{,baseline/}eval_test.json``: CE and SS of the same seed, same machine) or
trained here when ``--baseline_dir`` is not given. Writes ``<out>.json`` (every run's test summary and training
curve) and ``<out>.md`` (paired differences to SS and the bar: PR-AUC >= SS and t->i R@1 >= SS - 0.5 points).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
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

FIGS = ("pr_auc", "t2i_r1", "i2t_r1", "mean_calibration_error")


def run_one(
    name: str, overrides: str, seed: int, workdir: pathlib.Path, skip_started: bool = False, no_run: bool = False
) -> dict | None:
    """Train + evaluate one (candidate, seed); returns its test summary and training curve (``None``: skipped,
    ``skip_started`` and another invocation has started it, or ``no_run`` and it has not run)."""
    out = workdir / name / f"seed{seed}"
    model_dir, eval_json = out / "model", out / "model" / "eval" / "eval_test.json"
    start = time.perf_counter()
    if not eval_json.exists() and no_run:
        return None
    if not eval_json.exists() and (out / "run.log").exists() and skip_started:
        print(f"{name} seed {seed}: started by another invocation, skipped", flush=True)
        return None
    if not eval_json.exists():
        out.mkdir(parents=True, exist_ok=True)
        py = [sys.executable, "-m", "ce_retrieval.cli"]
        ov = f"train.seed={seed}" + (f",{overrides}" if overrides else "")
        with open(out / "run.log", "w") as log:
            for cmd in (
                [*py, "train", "--config", "synthetic_demo", "--model_dir", str(model_dir), "--params_override", ov],
                [*py, "evaluate", "--model_dir", str(model_dir), "--split", "test", "--no_plots"],
            ):
                code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False).returncode
                if code:
                    raise SystemExit(f"{name} seed {seed} failed (exit {code}); see {out / 'run.log'}")
    print(f"{name} seed {seed}: {time.perf_counter() - start:.0f} s, load {load_average()[0]:.1f}", flush=True)
    return {"summary": json.loads(eval_json.read_text())["summary"], "curve": curve(model_dir)}


def curve(model_dir: pathlib.Path) -> dict:
    """Per-epoch training loss and in-batch R@1 (``train_summary.json``)."""
    s = json.loads((model_dir / "train_summary.json").read_text())
    h = s["history"] if isinstance(s["history"], dict) else ast.literal_eval(s["history"])
    return {k: [round(float(v), 4) for v in h[k]] for k in ("loss", "in_batch_recall_at_1") if k in h}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--candidate", action="append", default=[], help="name=override[,override...]")
    p.add_argument("--workdir", default="runs/recipe")
    p.add_argument("--baseline_dir", default=None, help="a demo_seeds.py workdir with CE and SS of each seed")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no_run", action="store_true", help="only collect the runs already on disk")
    p.add_argument("--skip_started", action="store_true", help="leave runs another invocation has started")
    p.add_argument("--out", default="benchmarks/results/recipe_demo")
    args = p.parse_args(argv)
    workdir = pathlib.Path(args.workdir)
    cands = dict(c.split("=", 1) for c in args.candidate)
    if not args.baseline_dir:
        cands = {"SS": "loss.name=SampledSoftmax", "CE": "", **cands}
    jobs = [(n, o, s) for s in args.seeds for n, o in cands.items()]  # seed-major: paired results come early
    runs: dict = {}
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        futures = {pool.submit(run_one, n, o, s, workdir, args.skip_started, args.no_run): (n, s) for n, o, s in jobs}
        for f in concurrent.futures.as_completed(futures):
            n, s = futures[f]
            if (result := f.result()) is not None:
                runs.setdefault(n, {})[s] = result
    if args.baseline_dir:
        for s in args.seeds:
            d = pathlib.Path(args.baseline_dir) / f"seed{s}"
            for n, sub, mdir in (("SS", "eval/baseline", "baseline/model"), ("CE", "eval", "model")):
                runs.setdefault(n, {})[s] = {
                    "summary": json.loads((d / sub / "eval_test.json").read_text())["summary"],
                    "curve": curve(d / mdir),
                }
    record = {
        "command": "python -m benchmarks.quality.recipe_seeds " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "load_average_1_5_15": load_average(),
        "candidates": {"SS": "loss.name=SampledSoftmax", "CE": "", **cands},
        "seeds": args.seeds,
        "runs": {n: {str(s): r for s, r in sorted(v.items())} for n, v in runs.items()},
    }
    write_record(*os.path.split(args.out), record, markdown(record))
    return 0


def markdown(record: dict) -> str:
    """Per-seed figures, paired differences to SS, and whether each candidate meets the bar on every seed."""
    seeds = [str(s) for s in record["seeds"]]
    ss = record["runs"]["SS"]
    lines = [
        "# Recipe candidates vs Sampled Softmax on the demo config (paired train seeds)",
        "",
        f"    {record['command']}",
        "",
        f"Date {record['date']}; machine {record['machine']}; load average at the end "
        f"{record['load_average_1_5_15']}. Test split, no distractors; 500 steps at batch 64.",
        "",
        "| candidate | overrides | seed | PR-AUC | Δ SS | t→i R@1 | Δ SS | i→t R@1 | cal. error | "
        "last-epoch loss / in-batch R@1 | bar |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, runs in record["runs"].items():
        for s in seeds:
            if s not in runs:
                continue
            m, b = runs[s]["summary"], ss[s]["summary"]
            c = runs[s]["curve"]
            dp, dr = 100 * (m["pr_auc"] - b["pr_auc"]), 100 * (m["t2i_r1"] - b["t2i_r1"])
            ok = "yes" if dp >= 0 and dr >= -0.5 else "no"
            ce = m.get("mean_calibration_error")
            lines.append(
                f"| {name} | `{record['candidates'].get(name, '')}` | {s} | {100 * m['pr_auc']:.1f} | {dp:+.1f} | "
                f"{100 * m['t2i_r1']:.1f} | {dr:+.1f} | {100 * m['i2t_r1']:.1f} | "
                f"{'-' if ce is None else f'{100 * ce:.1f}'} | "
                f"{c['loss'][-1]:.2f} / {c.get('in_batch_recall_at_1', [0])[-1]:.2f} | {ok if name != 'SS' else ''} |"
            )
    lines += ["", "Mean over the seeds both have (paired) and seeds meeting the bar:", ""]
    lines += ["| candidate | n | mean Δ PR-AUC | min Δ PR-AUC | mean Δ t→i R@1 | min Δ t→i R@1 | seeds meeting bar |"]
    lines += ["|---|---:|---:|---:|---:|---:|---:|"]
    for name, runs in record["runs"].items():
        if name == "SS":
            continue
        common = [s for s in seeds if s in runs and s in ss]
        dp = [100 * (runs[s]["summary"]["pr_auc"] - ss[s]["summary"]["pr_auc"]) for s in common]
        dr = [100 * (runs[s]["summary"]["t2i_r1"] - ss[s]["summary"]["t2i_r1"]) for s in common]
        ok = sum(a >= 0 and b >= -0.5 for a, b in zip(dp, dr, strict=True))
        lines.append(
            f"| {name} | {len(common)} | {sum(dp) / len(dp):+.1f} | {min(dp):+.1f} | {sum(dr) / len(dr):+.1f} | "
            f"{min(dr):+.1f} | {ok}/{len(common)} |"
        )
    lines += ["", "Training curves (per epoch of 100 steps): loss; in-batch R@1", ""]
    for name, runs in record["runs"].items():
        for s in seeds:
            if s in runs:
                c = runs[s]["curve"]
                lines.append(f"- {name} seed {s}: {c['loss']}; {c.get('in_batch_recall_at_1')}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
