"""The guaranteed thresholds against MAPIE's precision control, on generated score models whose truth is known.

    python -m benchmarks.quality.guarantee_vs_mapie --draws 200 --out benchmarks/results/guarantee_vs_mapie

MAPIE's ``BinaryClassificationController(risk="precision")`` (Learn then Test with Hoeffding–Bentkus p-values,
Bonferroni over its thresholds) bounds the precision of "score ≥ τ" over samples drawn i.i.d. — here the
validation pairs — at the validation gallery's size. ``evaluation.guarantee`` bounds TPR and FPR separately
(two-way cluster-robust Clopper–Pearson, Bonferroni over 64 candidates × 2 rates) so that it can speak about a
gallery of another size and about pairs that share a caption or an image. Where both apply (the served gallery
the size of the validation one) they promise the same thing, so the comparison says what each costs.

Score model (as ``tests/evaluation/test_guarantee.py``): s_ij = a_i + b_j + e_ij for an irrelevant pair,
μ₁ + a_i + b_j + e'_ij for a relevant one (query effect a ~ N(0, σ_a), image effect b ~ N(0, σ_b)); U images with
C captions each, each caption relevant to its own image among M. Marginally Gaussian, so the true TPR, FPR and the
precision at any gallery size are known in closed form. Settings:

* ``iid``: σ_a = σ_b = 0, one caption per image (every pair independent: MAPIE's assumption holds);
* ``clustered``: σ_a = σ_b = 0.06, two captions per image (the test suite's model);
* ``clustered_strong``: σ_a = σ_b = 0.1, three captions per image;
* ``served_10x``: ``iid`` measured on validation, served on a gallery ten times larger (MAPIE has no term for the
  gallery's size: its threshold is used as it is).

Per setting, method and level (0.5, 0.8, 0.9; δ = 0.1; MAPIE run per level, the library for all levels at once):
the share of draws with a threshold (certified), the share of those whose true precision on the served gallery is
≥ the level (kept), and the mean true recall (TPR) at the threshold when certified. Writes ``<out>.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import warnings

import numpy as np
from scipy import stats

from benchmarks.common.machine import cpu_name, load_average
from benchmarks.common.records import write_record
from ce_retrieval.evaluation.guarantee import guaranteed_thresholds, precision_at_size, rates_from_scores

LEVELS = (0.5, 0.8, 0.9)
DELTA = 0.1
MU1 = 0.3
# name: (sigma_a, sigma_b, sigma_e (irrelevant), sigma_e' (relevant), images U, captions per image C, gallery M,
#        served gallery size)
SETTINGS = {
    "iid": (0.0, 0.0, 0.1, 0.1, 300, 1, 100, 100),
    "clustered": (0.06, 0.06, 0.08, 0.08, 150, 2, 100, 100),
    "clustered_strong": (0.1, 0.1, 0.05, 0.05, 100, 3, 100, 100),
    "served_10x": (0.0, 0.0, 0.1, 0.1, 300, 1, 100, 1000),
}
MAPIE_THRESHOLDS = 100  # MAPIE's candidate thresholds (Bonferroni over them), evenly spaced in score


def draw(rng, setting) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One validation draw: scores [U·C, M], each caption's relevant image id, the image ids."""
    sa, sb, se, sp, units, captions, m, _ = setting
    a, b = rng.normal(0, sa, units * captions), rng.normal(0, sb, m)
    s = a[:, None] + b[None, :] + rng.normal(0, se, (units * captions, m))
    qids = np.repeat(np.arange(units), captions) % m
    s[np.arange(len(qids)), qids] = MU1 + a + b[qids] + rng.normal(0, sp, len(qids))
    return s, qids, np.arange(m)


def truth(t: float, setting) -> tuple[float, float]:
    """True precision on the served gallery and true recall (TPR) of "score ≥ t"."""
    sa, sb, se, sp, *_, served = setting
    sig0, sig1 = np.sqrt(sa**2 + sb**2 + se**2), np.sqrt(sa**2 + sb**2 + sp**2)
    tpr, fpr = stats.norm.sf((t - MU1) / sig1), stats.norm.sf(t / sig0)
    return float(precision_at_size(tpr, fpr, served, 1.0)), float(tpr)


def mapie_threshold(scores: np.ndarray, labels: np.ndarray, level: float, grid: np.ndarray) -> float | None:
    """MAPIE's certified threshold of largest recall for precision ≥ ``level`` (None when it certifies none)."""
    from mapie.risk_control import BinaryClassificationController

    def proba(x):  # scores as a "probability" column: thresholds are compared with it, so any score works
        return np.stack([1.0 - x, x], axis=1)

    controller = BinaryClassificationController(
        proba,
        risk="precision",
        target_level=level,
        confidence_level=1.0 - DELTA,
        best_predict_param_choice="recall",
        list_predict_params=grid,
        fwer_method="bonferroni",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no valid threshold" is an outcome here, counted below
        controller.calibrate(scores, labels)
    best = controller.best_predict_param
    return None if best is None else float(best)


def run_setting(name: str, draws: int, seed: int) -> dict:
    setting = SETTINGS[name]
    rng = np.random.default_rng(seed)
    sig1 = np.sqrt(setting[0] ** 2 + setting[1] ** 2 + setting[3] ** 2)
    grid = np.linspace(MU1 - 2 * sig1, MU1 + 3 * sig1, MAPIE_THRESHOLDS)
    out = {m: {f"{p:g}": {"certified": 0, "kept": 0, "recall": []} for p in LEVELS} for m in ("library", "mapie")}
    all_kept = {"library": 0, "mapie": 0}
    for _ in range(draws):
        s, qids, dids = draw(rng, setting)
        labels = np.zeros(s.shape, dtype=int)
        labels[np.arange(len(qids)), qids] = 1
        ours = guaranteed_thresholds(rates_from_scores(s, qids, dids), LEVELS, DELTA, gallery_size=setting[7])
        taus = {
            "library": {f"{p:g}": ours["threshold_at_precision"][f"{p:g}"] for p in LEVELS},
            "mapie": {f"{p:g}": mapie_threshold(s.ravel(), labels.ravel(), p, grid) for p in LEVELS},
        }
        for method, by_level in taus.items():
            ok = True
            for key, t in by_level.items():
                if t is None:
                    continue
                precision, recall = truth(t, setting)
                cell = out[method][key]
                cell["certified"] += 1
                cell["kept"] += precision >= float(key)
                cell["recall"].append(recall)
                ok &= precision >= float(key)
            all_kept[method] += ok
    for method in out.values():
        for cell in method.values():
            cell["recall"] = float(np.mean(cell["recall"])) if cell["recall"] else None
    return {"setting": dict(zip(("sigma_a", "sigma_b", "sigma_e", "sigma_e_relevant", "images", "captions",
                                 "gallery", "served"), setting, strict=True)),
            "draws": draws, "levels": out, "all_levels_kept": all_kept}  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--draws", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--out", default="benchmarks/results/guarantee_vs_mapie")
    args = p.parse_args(argv)
    import mapie

    start, load = time.perf_counter(), {"start": load_average()}
    results = {name: run_setting(name, args.draws, args.seed) for name in args.settings}
    load["end"] = load_average()
    record = {
        "command": "python -m benchmarks.quality.guarantee_vs_mapie "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "load_average_1_5_15": load,
        "seconds": round(time.perf_counter() - start, 1),
        "mapie_version": mapie.__version__,
        "delta": DELTA,
        "results": results,
    }
    write_record(*os.path.split(args.out), record, markdown(record))
    return 0


def markdown(record: dict) -> str:
    lines = [
        "# Guaranteed thresholds against MAPIE's precision control",
        "",
        f"    {record['command']}",
        "",
        f"Date {record['date']}; {record['machine']}; load average (1, 5, 15 min) {record['load_average_1_5_15']}; "
        f"{record['seconds']} s; MAPIE {record['mapie_version']}; δ = {record['delta']}. Generated score models "
        "(module docstring of `benchmarks/quality/guarantee_vs_mapie.py`); truth in closed form. Certified: share "
        "of draws with a threshold; kept: share of those whose true precision on the served gallery reaches the "
        "level; recall: mean true recall at the threshold when certified. The library certifies all levels at "
        "once; MAPIE is run per level.",
        "",
        "| setting | served / validation gallery | method | level | certified | kept | recall | all levels kept |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in record["results"].items():
        st, n = r["setting"], r["draws"]
        for method, by_level in r["levels"].items():
            for key, c in by_level.items():
                kept = "-" if not c["certified"] else f"{c['kept'] / c['certified']:.3f}"
                rec = "-" if c["recall"] is None else f"{c['recall']:.3f}"
                lines.append(
                    f"| {name} | {st['served']} / {st['gallery']} | {method} | {key} | {c['certified'] / n:.3f} | "
                    f"{kept} | {rec} | {r['all_levels_kept'][method] / n:.3f} |"
                )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
