"""The record of issue 21 part 3: recipe candidates against SS, paired over seeds, on the demo and in the suite's
heads regime on every family, and whether each meets the bar (PR-AUC >= SS and t->i R@1 >= SS - 0.5 points on
every family and regime, paired over seeds).

    python -m benchmarks.quality.recipe_report --demo runs/recipe_demo.json --heads runs/recipe_heads \
        --out benchmarks/results/recipe

``--demo``: the JSON of ``benchmarks/quality/recipe_seeds.py``; ``--heads``: the ``--out`` folder of
``benchmarks/quality/recipe_heads.py`` (one suite folder per recipe; SS and CE in the first). Writes ``<out>.json`` and
``<out>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import pathlib

from benchmarks.common.machine import cpu_name, load_average
from benchmarks.common.records import write_record

FIGS = (("pr_auc", "PR-AUC"), ("t2i_r1", "t→i R@1"), ("i2t_r1", "i→t R@1"), ("mean_calibration_error", "cal. err."))


def heads_runs(folder: str) -> dict:
    """``{family: {objective label: {seed: summary}}}`` from every recipe folder's heads runs (a recipe's label is
    its folder name)."""
    out: dict = {}
    for path in sorted(glob.glob(os.path.join(folder, "*", "runs", "heads", "*", "*.json"))):
        doc = json.loads(pathlib.Path(path).read_text())
        label = doc["run_name"]
        if label == "recipe":
            label = pathlib.Path(path).parents[3].name
        out.setdefault(doc["family"], {}).setdefault(label, {})[doc["config"]["train"]["seed"]] = doc["summary"]
    return out


def paired(runs: dict, label: str, base: str = "SS") -> dict:
    """Paired differences of ``label`` to ``base`` (points) over the seeds both have, and the bar per seed."""
    seeds = sorted(set(runs[label]) & set(runs[base]))

    def delta(k, s):
        a, b = runs[label][s].get(k), runs[base][s].get(k)
        return None if a is None or b is None else 100 * (a - b)

    d = {k: [delta(k, s) for s in seeds] for k, _ in FIGS}
    meets = [d["pr_auc"][i] >= 0 and d["t2i_r1"][i] >= -0.5 for i in range(len(seeds))]
    mean_pr, mean_r1 = _mean(d["pr_auc"]), _mean(d["t2i_r1"])
    return {"seeds": seeds, "delta": d, "meets": meets, "meets_on_mean": mean_pr >= 0 and mean_r1 >= -0.5}


def _mean(values) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _row(name: str, p: dict) -> str:
    d = p["delta"]
    mean = {k: _mean(v) for k, v in d.items()}
    cal = "n/a" if mean["mean_calibration_error"] is None else f"{mean['mean_calibration_error']:+.2f}"
    return (
        f"| {name} | {len(p['seeds'])} | {mean['pr_auc']:+.2f} (min {min(d['pr_auc']):+.2f}) | "
        f"{mean['t2i_r1']:+.2f} (min {min(d['t2i_r1']):+.2f}) | {mean['i2t_r1']:+.2f} | "
        f"{cal} | {sum(p['meets'])}/{len(p['meets'])} | {'yes' if p['meets_on_mean'] else 'no'} |"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--demo", required=True)
    p.add_argument("--heads", required=True)
    p.add_argument("--out", default="benchmarks/results/recipe")
    p.add_argument("--versus", action="append", default=[], help="A:B also pairs A against B (e.g. the same λ)")
    p.add_argument("--note", action="append", default=[], help="a paragraph for the record's header")
    args = p.parse_args(argv)
    demo = json.loads(pathlib.Path(args.demo).read_text())
    demo_runs = {n: {int(s): r["summary"] for s, r in v.items()} for n, v in demo["runs"].items()}
    heads = heads_runs(args.heads)
    table = {"demo (scratch, 500 steps)": demo_runs, **{f"heads / {f}": r for f, r in sorted(heads.items())}}
    record = {
        "command": "python -m benchmarks.quality.recipe_report"
        + f" --demo {args.demo} --heads {args.heads} --out {args.out}"
        + " --note ..." * len(args.note),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "load_average_1_5_15": load_average(),
        "demo_command": demo["command"],
        "demo_candidates": demo["candidates"],
        "paired": {
            where: {n: paired(runs, n) for n in runs if n != "SS" and "SS" in runs} for where, runs in table.items()
        },
        "versus": {
            where: {
                f"{a} vs {b}": paired(runs, a, b)
                for a, b in (v.split(":") for v in args.versus)
                if a in runs and b in runs and set(runs[a]) & set(runs[b])
            }
            for where, runs in table.items()
        },
        "demo_curves": {n: {s: r["curve"] for s, r in v.items()} for n, v in demo["runs"].items()},
    }
    merged = {where: {**record["paired"][where], **record["versus"][where]} for where in record["paired"]}
    names = sorted({n for v in merged.values() for n in v})
    everywhere = {n: all(n in v for v in merged.values()) for n in names}
    verdict = {
        n: {
            "every_seed": everywhere[n] and all(all(v[n]["meets"]) for v in merged.values() if n in v),
            "paired_means": everywhere[n] and all(v[n]["meets_on_mean"] for v in merged.values() if n in v),
        }
        for n in names
    }
    record["meets_bar_everywhere"] = verdict
    lines = [
        "# Issue 21, part 3: recipe candidates against Sampled Softmax, paired over seeds",
        "",
        f"    {record['command']}",
        f"    {demo['command']}",
        "",
        f"Date {record['date']}; machine {record['machine']}; load average {record['load_average_1_5_15']} "
        "(2 cores shared by several jobs; the figures do not depend on the load). Δ: candidate − SS in points, "
        "paired by seed; *bar (seeds)*: seeds where Δ PR-AUC ≥ 0 and Δ t→i R@1 ≥ −0.5; *bar (means)*: "
        "the same on the paired means.",
        "",
        *[line for note in args.note for line in (note, "")],
    ]
    for where, by_name in record["paired"].items():
        head = "| objective | seeds | Δ PR-AUC | Δ t→i R@1 | Δ i→t R@1 | Δ cal. err. | bar (seeds) | bar (means) |"
        lines += [f"## {where}", "", head]
        lines += ["|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [_row(n, p) for n, p in sorted(by_name.items())]
        lines += [_row(n, p) for n, p in sorted(record["versus"][where].items())]
        runs = table[where]
        lines += ["", "| objective | seed | " + " | ".join(t for _, t in FIGS) + " |", "|---|---:|" + "---:|" * 4]
        for n in sorted(runs):
            for s in sorted(runs[n]):
                vals = [runs[n][s].get(k) for k, _ in FIGS]
                lines.append(
                    f"| {n} | {s} | " + " | ".join("-" if v is None else f"{100 * v:.2f}" for v in vals) + " |"
                )
        lines.append("")
    lines += ["## Meets the bar on every family and regime", ""]
    lines += ["(Only objectives measured in every regime and family can; per seed / on the paired means.)", ""]
    lines += [
        f"- {n}: every seed {'yes' if v['every_seed'] else 'no'}; paired means {'yes' if v['paired_means'] else 'no'}"
        for n, v in verdict.items()
    ]
    lines += ["", "## Demo training curves (per epoch of 100 steps): loss; in-batch R@1", ""]
    for n, by_seed in record["demo_curves"].items():
        for s, c in sorted(by_seed.items()):
            lines.append(f"- {n} seed {s}: {c['loss']}; {c.get('in_batch_recall_at_1')}")
    write_record(*os.path.split(args.out), record, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
