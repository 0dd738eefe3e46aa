"""The main job over several seeds: the range (min–max per headline figure) the README states and the package ships.

    python -m benchmarks.quality.demo_seeds --seeds 0 1 2 --workdir runs/demo_seeds \
        --out benchmarks/results/demo_seeds --package

Runs ``ce-retrieval demo --params_override train.seed=S`` once per seed, each in its own process and workdir
(``<workdir>/seed<S>``; a finished training is reused, as the demo does), reads the ``record.json`` each run writes
(``ce_retrieval/cli/demo_record.py``), and writes ``<out>.json`` (every seed's record and the range) and ``<out>.md``
(the range table, machine, load, dates). ``--no_run`` only collects records already on disk. The figures do not
depend on the load; the seconds do (the load is recorded beside them).

``--package`` writes a file of the package as well: the range goes to ``ce_retrieval/cli/demo_range.json``, which
every ``ce-retrieval demo`` compares its own figures with (:func:`package_range`). Without it, the package is left
as it is; with it, commit the new file beside the record it came from.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

from benchmarks import ROOT
from benchmarks.common.machine import load_average
from benchmarks.common.records import write_record
from ce_retrieval.cli.demo_record import FIGURES, RANGE_FILE, fmt


def run_seed(seed: int, workdir: pathlib.Path, extra: list[str]) -> dict:
    """One demo run (its own process; output in ``demo.log``) and the record it wrote."""
    out = workdir / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "ce_retrieval.cli", "demo", "--workdir", str(out)]
    cmd += ["--params_override", f"train.seed={seed}", *extra]
    load = load_average()
    start = time.perf_counter()
    with open(out / "demo.log", "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False).returncode
    if code != 0:
        raise SystemExit(f"demo with seed {seed} failed (exit {code}); see {out / 'demo.log'}")
    print(f"seed {seed}: {time.perf_counter() - start:.0f} s, load average before {load[0]:.2f}", flush=True)
    return read_record(out)


def read_record(seed_dir: pathlib.Path) -> dict:
    """The run's ``record.json``, plus each model's last-epoch training figures from its ``train_summary.json``
    (how far training got is what separates the seeds)."""
    path = seed_dir / "record.json"
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run the demo there first (without --no_run)")
    record = json.loads(path.read_text())
    record["training"] = {}
    for model_dir in (seed_dir / "model", seed_dir / "baseline" / "model", *sorted(seed_dir.glob("baseline_*/model"))):
        summary = model_dir / "train_summary.json"
        if summary.exists():
            s = json.loads(summary.read_text())
            history = s["history"] if isinstance(s["history"], dict) else ast.literal_eval(s["history"])
            record["training"][s["loss"]] = {
                k: history[k][-1] for k in ("loss", "in_batch_recall_at_1") if k in history
            } | ({"seconds": s["seconds"]} if "seconds" in s else {})
    return record


def value_range(records: list[dict]) -> dict:
    """``{run: {figure: [min, max]}}`` over the records (``None`` where no seed has a value); ``missing`` counts
    the seeds without one (e.g. no threshold reaches precision 0.5)."""
    runs = {}
    for name in records[0]["runs"]:
        ranges = {}
        for key in FIGURES:
            values = [r["runs"][name].get(key) for r in records if name in r["runs"]]
            present = [v for v in values if v is not None]
            ranges[key] = [min(present), max(present)] if present else [None, None]
            if len(present) < len(values):
                ranges.setdefault("missing", {})[key] = len(values) - len(present)
        runs[name] = ranges
    return runs


def summary(records: list[dict]) -> dict:
    first = records[0]
    return {
        "kind": "ce_retrieval demo range over seeds",
        "seeds": [r["seed"] for r in records],
        "date": min(r["date"] for r in records),
        "config": first["config"],
        "steps": first["steps"],
        "batch_size": first["batch_size"],
        "git_commit": first["git_commit"],
        "machine": first["machine"],
        "runs": value_range(records),
    }


def markdown(rng: dict, records: list[dict], command: str) -> str:
    names = list(rng["runs"])
    m = rng["machine"]
    lines = [
        "# The main job over seeds (`ce-retrieval demo`)",
        "",
        f"    {command}",
        "",
        f"Seeds {rng['seeds']} of `train.seed` (model initialisation and batch order; the data seed stays "
        f"{records[0]['data_seed']}), {rng['steps']} steps at batch {rng['batch_size']}, config {rng['config']}, "
        f"commit {rng['git_commit']}. Machine: {m.get('cpu')}, {m.get('cpu_count')} cores, flags "
        f"{' '.join(m.get('cpu_flags', []))}, TensorFlow {m.get('tensorflow')} (intra-op threads "
        f"{m.get('tf_intra_op_threads', 'default')}), {m.get('gpus')} GPU.",
        "",
        "| seed | date (UTC) | seconds of this invocation | load average at its end (1, 5, 15 min) |",
        "|---:|---|---:|---|",
    ]
    lines += [f"| {r['seed']} | {r['date']} | {r['seconds']} | {r['load_average_1_5_15']} |" for r in records]
    lines += [
        "",
        "A seed whose workdir already held its trained models only re-ran evaluation, export, index and queries, so "
        "its seconds are not a training time. The figures do not depend on the load.",
    ]
    lines += ["", "Range over the seeds (min – max; test split):", ""]
    lines += ["| figure | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key, (label, unit) in FIGURES.items():
        cells = []
        for n in names:
            lo, hi = rng["runs"][n][key]
            missing = rng["runs"][n].get("missing", {}).get(key)
            cell = f"{fmt(lo, unit)} – {fmt(hi, unit)}" if lo is not None else "none"
            cells.append(cell + (f" ({missing} seed(s) without one)" if missing and lo is not None else ""))
        lines.append(f"| {label.strip()}{' (%)' if unit == '%' else ''} | " + " | ".join(cells) + " |")
    lines += ["", f"{spread_line(rng)}", "", mean_line(records)]
    if all(r.get("training") for r in records):
        lines += ["", "Training (from each model's train_summary.json): last epoch's loss / in-batch R@1; seconds", ""]
        lines += ["| seed | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
        for r in records:
            cells = [
                f"{r['training'][n]['loss']:.2f} / {r['training'][n]['in_batch_recall_at_1']:.2f}"
                + (f"; {r['training'][n]['seconds']:.1f} s" if "seconds" in r["training"][n] else "")
                if n in r["training"]
                else "-"
                for n in names
            ]
            lines.append(f"| {r['seed']} | " + " | ".join(cells) + " |")
    lines += ["", "Per seed:", ""]
    lines += ["| figure | " + " | ".join(f"{n} seed {r['seed']}" for n in names for r in records) + " |"]
    lines += ["|---|" + "---:|" * (len(names) * len(records))]
    for key, (label, unit) in FIGURES.items():
        cells = [fmt(r["runs"][n].get(key), unit) for n in names for r in records]
        lines.append(f"| {label.strip()} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def spread_line(rng: dict) -> str:
    """The text→image R@1 spread over the seeds (max − min, in points) per objective: the figure the main job's
    seed goal (≤ 10 points, issue #30 item 4) is about: the difference of the unrounded fractions, which can differ by
    0.1 from the difference of the range's rounded ends."""
    cells = []
    for name, run in rng["runs"].items():
        lo, hi = run["t2i_r1"]
        cells.append(f"{name} {100 * (hi - lo):.1f}" if lo is not None else f"{name} -")
    return "Text→image R@1 spread over the seeds (max − min, points; the goal is ≤ 10): " + ", ".join(cells) + "."


def mean_line(records: list[dict]) -> str:
    """Each objective's mean over the seeds of global PR-AUC and text→image R@1 (test, %): what a setting costs or
    gains on average, beside the range and the spread, when two settings of the main job are compared."""
    cells = []
    for name in records[0]["runs"]:
        means = []
        for key in ("pr_auc", "t2i_r1"):
            values = [r["runs"][name][key] for r in records if r["runs"].get(name, {}).get(key) is not None]
            means.append(f"{100 * sum(values) / len(values):.1f}" if values else "-")
        cells.append(f"{name} {means[0]} / {means[1]}")
    return "Mean over the seeds (global PR-AUC / text→image R@1, %): " + ", ".join(cells) + "."


def package_range(rng: dict) -> str:
    """Writes the range to ``ce_retrieval/cli/demo_range.json``, the package's file that every ``ce-retrieval demo``
    compares its own figures with (``demo_record.py``); returns its path. Only ``--package`` calls it: a run for a
    record alone leaves the package as it is."""
    pathlib.Path(RANGE_FILE).write_text(json.dumps(rng, indent=2) + "\n")
    return RANGE_FILE


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", default="runs/demo_seeds")
    parser.add_argument("--out", default="benchmarks/results/demo_seeds", help="writes OUT.json and OUT.md")
    parser.add_argument("--package", action="store_true", help=f"also write the range to {RANGE_FILE}")
    parser.add_argument("--no_run", action="store_true", help="collect the records already under --workdir")
    parser.add_argument("demo_args", nargs="*", help="after --: more arguments for `ce-retrieval demo`")
    args = parser.parse_args(argv)
    workdir = pathlib.Path(args.workdir).resolve()
    if args.no_run:
        records = [read_record(workdir / f"seed{s}") for s in args.seeds]
    else:
        records = [run_seed(s, workdir, args.demo_args) for s in args.seeds]
    rng = summary(records)
    command = "python -m benchmarks.quality.demo_seeds " + shlex.join(sys.argv[1:] if argv is None else argv)
    paths = write_record(*os.path.split(args.out), {"range": rng, "records": records}, markdown(rng, records, command))
    print("wrote " + " and ".join(paths))
    if args.package:
        print(f"wrote {package_range(rng)} (a file of the package: every demo run compares itself with it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
