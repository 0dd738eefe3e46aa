"""Do the precision promises hold? Coverage of the guaranteed thresholds on the calibration suite (#29, part 2).

For every run of the calibration suite on disk (``calibration_suite.py`` saves each run's val and test embeddings
and, with ``--promise_distractors N``, N more distractor images of the family), the promises are made the way the
index makes them and checked the way a user would meet them:

* calibration: ``calibrate_split`` on the run's validation queries, all of them or a resample of 100 / 300 / 1,000
  queries (whole query units: an image's captions stay together), against every validation image;
* served gallery: the test images as they are, and with 10x and 100x as many distractor images added (their own
  thresholds: ``Calibration.for_gallery(M)``);
* check: every test caption against that gallery, counted exactly (``transfer.counts_at_thresholds``): a promise
  "precision >= p" is kept when the achieved precision is >= p (a threshold that returns nothing is kept: nothing
  wrong was returned; counted apart as ``empty``); a refused level is no promise and counted as refused.

The figures: per regime, family, gallery and validation size, the share of promises kept (target >= 1 - delta),
the share refused, and the recall the guarantee leaves against the point estimate's (what the guarantee costs),
with the point estimate's own kept share beside. Runs of every objective are pooled (each is a model a user might
serve); the objectives' recall at guaranteed precision is in the suite's own table.

    python -m benchmarks.quality.calibration_suite --promise_distractors 50000    # the runs (saves what this reads)
    python -m benchmarks.quality.guarantee_coverage                               # the record
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import time

import numpy as np

from benchmarks.common.machine import LoadSampler, machine_info  # noqa: E402
from benchmarks.common.records import write_record  # noqa: E402
from ce_retrieval.evaluation.split_calibration import calibrate_split  # noqa: E402
from ce_retrieval.evaluation.transfer import counts_at_thresholds  # noqa: E402

# The 0.5 / 0.8 / 0.9, and lower levels that the weaker models of the suite can certify at all
LEVELS = (0.1, 0.2, 0.3, 0.5, 0.8, 0.9)
VAL_SIZES = (100, 300, 1000, None)  # None: the whole validation split
MULTIPLIERS = (1, 10, 100)


def _units_sample(val_ids: np.ndarray, size: int | None, rng: np.random.Generator) -> np.ndarray:
    """Query rows of a random set of whole query units (an image id's captions) holding about ``size`` queries."""
    if size is None:
        return np.arange(len(val_ids))
    units, counts = np.unique(val_ids, return_counts=True)
    if size >= len(val_ids):
        return np.arange(len(val_ids))
    take = max(1, int(round(size / counts.mean())))
    chosen = rng.choice(units, size=take, replace=False)
    return np.flatnonzero(np.isin(val_ids, chosen))


def run_checks(
    z, delta: float, resamples: int, rng, val_sizes=VAL_SIZES, multipliers=MULTIPLIERS, levels=LEVELS
) -> list[dict]:
    """Rows ``{val_size, resample, multiplier, level, kind, threshold, refused, predicted, hits, recall, kept}``
    for one run's arrays ``z`` (kind: guaranteed or estimated); guaranteed rows also carry ``certifiable``, the
    highest precision the calibration certifies at a candidate near the level (its threshold's, when certified)."""
    f = lambda k: np.asarray(z[k], np.float32)  # noqa: E731
    q, d, qi, di = f("q"), f("d"), z["q_ids"], z["d_ids"]
    vq, vd, vqi, vdi = f("val_q"), f("val_d"), z["val_q_ids"], z["val_d_ids"]
    extra = f("promise_d") if "promise_d" in z.files else np.zeros((0, d.shape[1]), np.float32)
    calibrations = []
    for size in [s for s in val_sizes if s is None or s < len(vqi)]:  # a size past the split is the whole split
        for r in range(1 if size is None else resamples):
            rows = _units_sample(vqi, size, rng)
            cal = calibrate_split(vq[rows], vd, vqi[rows], vdi, levels=levels, delta=delta)
            calibrations.append((size if size is not None else len(vqi), r, len(rows), cal))
    out = []
    for mult in multipliers:
        need = (mult - 1) * len(d)
        if need > len(extra):
            continue  # not enough distractors saved for this gallery
        gallery = np.concatenate([d, extra[:need]])
        ids = np.concatenate([di, np.full(need, int(min(di.min(), qi.min())) - 1, di.dtype)])
        blocks = [(size, r, n, cal.for_gallery(len(gallery))) for size, r, n, cal in calibrations]
        taus = {t for *_, b in blocks for key in ("threshold_at_precision",) for t in b[key].values() if t is not None}
        taus |= {t for *_, b in blocks for t in b["guaranteed"]["threshold_at_precision"].values() if t is not None}
        counts = counts_at_thresholds(sorted(taus), q, gallery, qi, ids)
        num_pos = int(np.sum(qi[:, None] == di[None, :]))
        for size, r, n, b in blocks:
            for level in levels:
                key = f"{level:g}"
                for kind, t in (
                    ("guaranteed", b["guaranteed"]["threshold_at_precision"][key]),
                    ("estimated", b["threshold_at_precision"].get(key)),
                ):
                    row = {"val_size": size, "val_queries": n, "resample": r, "multiplier": mult, "level": level}
                    row.update(kind=kind, threshold=t, refused=t is None)
                    if kind == "guaranteed":  # the highest precision a candidate near this level certifies
                        entry = b["guaranteed"]["levels"][key]
                        row["certifiable"] = entry.get("precision_lower_bound", entry.get("best_precision_lower_bound"))
                    if t is not None:
                        predicted, hits = counts[t]
                        row.update(predicted=predicted, hits=hits, recall=hits / num_pos)
                        row["kept"] = predicted == 0 or hits / predicted >= level
                        row["precision"] = hits / predicted if predicted else None
                    out.append(row)
    return out


def aggregate(rows: list[dict], delta: float) -> list[dict]:
    """Per (regime, family, multiplier, val_size, level): promises made / kept / refused / empty for the guarantee,
    the estimate's kept share, and the mean recall of both (refused: recall 0)."""
    groups = collections.defaultdict(list)
    for row in rows:
        groups[(row["regime"], row["family"], row["multiplier"], row["val_size"], row["level"])].append(row)
    out = []
    for (regime, family, mult, size, level), rs in sorted(groups.items()):
        g = [r for r in rs if r["kind"] == "guaranteed"]
        e = [r for r in rs if r["kind"] == "estimated"]
        made = [r for r in g if not r["refused"]]
        e_made = [r for r in e if not r["refused"]]
        out.append(
            {
                "regime": regime,
                "family": family,
                "multiplier": mult,
                "val_size": size,
                "level": level,
                "draws": len(g),
                "made": len(made),
                "kept": sum(r["kept"] for r in made),
                "empty": sum(r["predicted"] == 0 for r in made),
                "refused": len(g) - len(made),
                "kept_share": (sum(r["kept"] for r in made) / len(made)) if made else None,
                "estimate_made": len(e_made),
                "estimate_kept_share": (sum(r["kept"] for r in e_made) / len(e_made)) if e_made else None,
                "recall": float(np.mean([r.get("recall", 0.0) for r in g])),
                "estimate_recall": float(np.mean([r.get("recall", 0.0) for r in e])),
                "target": 1 - delta,
            }
        )
    return out


def by_objective(rows: list[dict]) -> list[dict]:
    """Recall at guaranteed precision per (regime, family, objective, level): the whole validation split, the test
    gallery as it is; mean and sd over the objective's runs (seeds, feature draws), refusals counted as 0."""
    groups = collections.defaultdict(list)
    for row in rows:
        if row["kind"] == "guaranteed" and row["multiplier"] == 1 and row["resample"] == 0:
            if row["val_queries"] == max(r["val_queries"] for r in rows if r["run"] == row["run"]):
                objective = row["run"].split("-seed")[0].split("-draw")[0]
                groups[(row["regime"], row["family"], objective, row["level"])].append(row)
    out = []
    for (regime, family, objective, level), rs in sorted(groups.items()):
        recalls = np.asarray([r.get("recall", 0.0) for r in rs])
        rs = sorted(rs, key=lambda r: r["run"])
        best = np.asarray([r["certifiable"] for r in rs if r.get("certifiable") is not None], np.float64)
        out.append(
            {
                "regime": regime,
                "family": family,
                "objective": objective,
                "level": level,
                "runs": len(rs),
                "recall": float(recalls.mean()),
                "recall_sd": float(recalls.std(ddof=1)) if len(rs) > 1 else None,
                "certified": sum(not r["refused"] for r in rs),
                "kept": sum(bool(r.get("kept")) for r in rs if not r["refused"]),
                "certifiable_min": float(best.min()) if len(best) else None,
                "certifiable_max": float(best.max()) if len(best) else None,
                "certifiable_by_run": {r["run"]: r.get("certifiable") for r in rs},
            }
        )
    return out


def highest_certified(table: list[dict]) -> list[dict]:
    """Per (regime, family, objective): the highest precision the guarantee certifies on the whole validation
    split for the test gallery as it is, min - max over the runs (read at the highest level's nearest candidates):
    a figure that separates models where no offered level is certified."""
    top = {}
    for o in table:
        key = (o["regime"], o["family"], o["objective"])
        if o["certifiable_max"] is not None and (key not in top or o["level"] > top[key]["level"]):
            top[key] = o
    names = ("regime", "family", "objective", "runs", "min", "max", "by_run")
    keys = ("runs", "certifiable_min", "certifiable_max", "certifiable_by_run")
    return [dict(zip(names, (*k, *(o[n] for n in keys)), strict=True)) for k, o in sorted(top.items())]


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def markdown(record: dict) -> str:
    m = record["machine"]
    lines = [
        "# Guarantee coverage: do the precision promises hold on test? (#29 part 2)",
        "",
        f"Command: `{record['command']}`. {record['num_runs']} runs from `{record['runs_dir']}` "
        f"({', '.join(record['regimes'])}; objectives {', '.join(record['objectives'])}; seeds pooled), "
        f"delta = {record['delta']} (target: >= {100 * (1 - record['delta']):.0f} % of promises kept), "
        f"{record['resamples']} resamples per validation size below the whole split.",
        f"Machine: {m['cpu']}, {m['cores']} cores, load {m['load_min']:.1f}–{m['load_max']:.1f}, {m['date']}; "
        f"{record['seconds']:.0f} s.",
        "",
        "Promises: a threshold guaranteed (confidence 1 − delta) for precision p on the served gallery (the test "
        "images, then with 10× and 100× as many distractors), checked over every test caption × gallery image pair. "
        "Kept: achieved precision ≥ p (a threshold returning nothing counts as kept, and as empty). Refused: the "
        "calibration could not certify p for that gallery size (no promise made; recall 0). Estimate: the point "
        "estimate's threshold for the same gallery size, with no confidence.",
        "",
        "## Totals (all families, regimes, validation sizes)",
        "",
        "| gallery | level | promises made | kept | refused | empty | estimate kept |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for t in record["totals"]:
        lines.append(
            f"| ×{t['multiplier']} | {t['level']:g} | {t['made']} | {_pct(t['kept_share'])} % | "
            f"{_pct(t['refused_share'])} % | {t['empty']} | {_pct(t['estimate_kept_share'])} % |"
        )
    lines += [
        "",
        "## Recall at guaranteed precision, by objective (whole validation split, test gallery as it is)",
        "",
        "Mean ± sd over the objective's runs (seeds; a suite run's draw-0 features), refused levels counted as 0; "
        "certified: runs whose calibration certified the level; kept: of those, runs whose promise held on test.",
        "",
        "| regime | family | objective | level | recall | certified | kept |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for o in record["objectives_table"]:
        sd = "" if o["recall_sd"] is None else f" ± {100 * o['recall_sd']:.1f}"
        lines.append(
            f"| {o['regime']} | {o['family']} | {o['objective']} | {o['level']:g} | {100 * o['recall']:.1f}{sd} % | "
            f"{o['certified']} / {o['runs']} | {o['kept']} / {o['certified']} |"
        )
    lines += [
        "",
        "## Highest precision certified, by objective (whole validation split, test gallery as it is)",
        "",
        "Min – max over the objective's runs: the highest precision the guarantee certifies at the candidate "
        "thresholds nearest to the highest level (that level's threshold where it is certified). It separates "
        "models where no offered level is certified.",
        "",
        "| regime | family | objective | runs | highest precision certified | per run |",
        "|---|---|---|---:|---:|---|",
    ]
    for o in highest_certified(record["objectives_table"]):
        per_run = ", ".join(f"{run} {v:.3f}" for run, v in o["by_run"].items() if v is not None)
        lines.append(
            f"| {o['regime']} | {o['family']} | {o['objective']} | {o['runs']} | "
            f"{o['min']:.3f} – {o['max']:.3f} | {per_run} |"
        )
    lines += [
        "",
        "## Per regime, family, gallery and validation size",
        "",
        "| regime | family | gallery | val queries | level | made / draws | kept | refused | recall: guaranteed "
        "| estimate | estimate kept |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in record["groups"]:
        lines.append(
            f"| {a['regime']} | {a['family']} | ×{a['multiplier']} | {a['val_size']} | {a['level']:g} | "
            f"{a['made']} / {a['draws']} | {_pct(a['kept_share'])} % | {a['refused']} | {_pct(a['recall'])} % | "
            f"{_pct(a['estimate_recall'])} % | {_pct(a['estimate_kept_share'])} % |"
        )
    return "\n".join(lines) + "\n"


def totals(groups: list[dict]) -> list[dict]:
    out = []
    keys = sorted({(g["multiplier"], g["level"]) for g in groups})
    for mult, level in keys:
        gs = [g for g in groups if g["multiplier"] == mult and g["level"] == level]
        made, kept, draws = sum(g["made"] for g in gs), sum(g["kept"] for g in gs), sum(g["draws"] for g in gs)
        e_made = sum(g["estimate_made"] for g in gs)
        e_kept = sum((g["estimate_kept_share"] or 0) * g["estimate_made"] for g in gs)
        out.append(
            {
                "multiplier": mult,
                "level": level,
                "made": made,
                "kept_share": kept / made if made else None,
                "refused_share": 1 - made / draws if draws else None,
                "empty": sum(g["empty"] for g in gs),
                "estimate_kept_share": e_kept / e_made if e_made else None,
            }
        )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="runs/calibration_suite", help="the suite's --out folder")
    parser.add_argument("--results", default=os.path.join("benchmarks", "results"))
    parser.add_argument("--name", default="guarantee_coverage")
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--resamples", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--levels", type=float, nargs="*", default=list(LEVELS))
    args = parser.parse_args(argv)
    loads: list = []
    sampler = LoadSampler(loads)
    sampler.start()
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    rows, regimes, objectives, runs = [], set(), set(), 0
    for path in sorted(glob.glob(os.path.join(args.runs, "runs", "*", "*", "*.npz"))):
        with np.load(path) as z:
            if "val_q" not in z.files:
                continue
            regime, family, name = path.split(os.sep)[-3], path.split(os.sep)[-2], os.path.basename(path)[:-4]
            objective = name.rsplit("-seed", 1)[0]
            # other feature draws: only what the by-objective table reads (whole validation split, gallery x1)
            light = {"val_sizes": (None,), "multipliers": (1,)} if "-draw" in name else {}
            for row in run_checks(z, args.delta, args.resamples, rng, levels=tuple(args.levels), **light):
                rows.append({"regime": regime, "family": family, "run": name, **row})
        runs += 1
        regimes.add(regime)
        objectives.add(objective)
        print(f"[coverage] {regime}/{family}/{name}: {time.perf_counter() - t0:.0f} s", flush=True)
    if not runs:
        print(f"no suite run with validation embeddings under {args.runs}: run calibration_suite.py first")
        return 1
    sampler.stop.set()
    groups = aggregate(rows, args.delta)
    record = {
        "command": "python -m benchmarks.quality.guarantee_coverage "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "runs_dir": args.runs,
        "num_runs": runs,
        "regimes": sorted(regimes),
        "objectives": sorted(objectives),
        "delta": args.delta,
        "resamples": args.resamples,
        "levels": list(args.levels),
        "totals": totals(groups),
        "objectives_table": by_objective(rows),
        "groups": groups,
        "machine": machine_info(loads),
        "seconds": time.perf_counter() - t0,
    }
    write_record(args.results, args.name, record, markdown(record))
    with open(os.path.join(args.runs, args.name + "_rows.json"), "w") as f:
        json.dump(rows, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
