"""Evaluation JSONs side by side in the layout of the paper's Table 1 (the ``ce-retrieval report`` command).

Rows are runs (files sharing a ``run_name`` are seeds of one run: the cell shows mean ± sample standard
deviation over them); columns are PR AUC, text->image Recall@1/5/10 on the test set, Recall@1/5/10/100 with
distractors, and rsum (R@1/5/10 summed over both directions). Numbers are percentages, as in the paper.
``--markdown out.md`` writes the same table in
Markdown, ``--plot out.png`` the PR curves of all runs in one figure (paper Figure 4, left).

Calibration columns follow: the precision achieved on the evaluated split by the thresholds calibrated on
validation for 50/80/90% precision, the mean |achieved - promised| over all calibrated levels (in points), and
the relative spread of the per-query best thresholds (``(p95 - p5) / (mean positive - mean negative score)``;
a ratio, lower is better calibrated) and the operating-point inconsistency OPIS of the caption queries (the
variance across queries of their TPR/TNR harmonic mean, averaged over the calibration range; shown x 10^3, lower
is more threshold-consistent). ``--reliability out.png`` plots promised against achieved precision for
all runs (mean over seeds, band = standard deviation). When runs named ``CrossExampleSoftmax`` and
``SampledSoftmax`` are both present, "CE − SS" lines give their paired difference in PR AUC and R@1
(:func:`paired_difference`: seeds paired by ``config.train.seed``, paired t-test).
"""

from __future__ import annotations

import json
import warnings

import numpy as np

__all__ = [
    "format_markdown",
    "format_paired",
    "format_table",
    "group_runs",
    "load_results",
    "paired_difference",
    "plot_reliability_report",
    "plot_report",
]

_TEST = [("pr_auc", "PR AUC"), ("t2i_r1", "@1"), ("t2i_r5", "@5"), ("t2i_r10", "@10")]
_DIS = [("dis_t2i_r1", "@1"), ("dis_t2i_r5", "@5"), ("dis_t2i_r10", "@10"), ("dis_t2i_r100", "@100")]
_TAIL = [("rsum", "rsum")]
_ACHIEVED = [("achieved_precision_0.5", "@50%"), ("achieved_precision_0.8", "@80%"), ("achieved_precision_0.9", "@90%")]
_SPREAD = [("mean_calibration_error", "cal.err"), ("relative_threshold_spread", "rel.spread"), ("opis", "OPIS")]
_COLUMNS = _TEST + _DIS + _TAIL + _ACHIEVED + _SPREAD
# rel.spread is a ratio, OPIS a variance of fractions (at most 1/4) shown x 10^3; every other column is a fraction
# shown in %.
_SCALE = {"relative_threshold_spread": 1.0, "opis": 1e3}
# The paired comparison printed when both runs are present: (a, b, label) and the figures compared.
_PAIRED = ("CrossExampleSoftmax", "SampledSoftmax", "CE − SS")
_PAIRED_KEYS = [("pr_auc", "PR AUC"), ("t2i_r1", "R@1")]


def load_results(paths) -> list[dict]:
    results = []
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise SystemExit(f"report: cannot read {path}: {exc}") from exc
        if "summary" not in doc:
            raise SystemExit(
                f"report: {path} is not an evaluation JSON (no 'summary'); make it with `ce-retrieval evaluate`"
            )
        doc.setdefault("run_name", path)
        doc["_path"] = str(path)
        results.append(doc)
    return results


def group_runs(results: list[dict]) -> dict[str, list[dict]]:
    """``{run_name: [results]}`` in order of first appearance."""
    groups: dict[str, list[dict]] = {}
    for doc in results:
        groups.setdefault(str(doc["run_name"]), []).append(doc)
    return groups


def _cell(values, scale: float) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    values = np.asarray(values, np.float64) * scale
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{values.mean():.2f} ± {values.std(ddof=1):.2f}"


def _rows(groups):
    rows = []
    for name, docs in groups.items():
        cells = []
        for key, _ in _COLUMNS:
            cells.append(_cell([d["summary"].get(key) for d in docs], _SCALE.get(key, 100.0)))
        rows.append((name, str(len(docs)), cells))
    return rows


def _distractor_title(results) -> str:
    counts = sorted({int(d.get("num_distractors") or 0) for d in results})
    if counts == [0]:
        return "with distractors (none)"
    return "+" + "/".join(f"{c:,}" for c in counts) + " distractors"


def _calibration_name(results) -> str:
    """The calibration split's short name (``val``) when all files agree, else ``calibration split``."""
    names = {(d.get("calibration_split") or {}).get("name") for d in results} - {None}
    return str(names.pop()).rstrip("/").split("/")[-1] if len(names) == 1 else "calibration split"


def format_table(results: list[dict]) -> str:
    """The plain-text table (two header lines like the paper's Table 1), then any "CE − SS" comparison."""
    rows = _rows(group_runs(results))
    headers = ["Run", "n"] + [h for _, h in _COLUMNS]
    widths = [
        max(len(headers[i]), *(len(r[0]) if i == 0 else len(r[1]) if i == 1 else len(r[2][i - 2]) for r in rows))
        for i in range(len(headers))
    ]

    def line(cells):
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    def span(a, b):
        return sum(widths[a:b]) + 2 * (b - a - 1)

    groups = [
        (0, 3, ""),
        (3, 6, "Recall on test set"),
        (6, 10, _distractor_title(results)),
        (10, 11, ""),
        (11, 14, f"precision, {_calibration_name(results)} thresholds"),
        (14, len(widths), ""),
    ]
    top = "  ".join(title.center(span(a, b)) if title else " " * span(a, b) for a, b, title in groups)
    out = [top.rstrip(), line(headers), "-" * len(line(headers))]
    out += [line([name, n, *cells]) for name, n, cells in rows]
    notes = []
    if len({d.get("dataset_fingerprint") for d in results}) > 1:
        notes.append("note: the files were evaluated on different datasets (dataset_fingerprint differs)")
    if any(len(docs) > 1 for docs in group_runs(results).values()):
        notes.append("cells: mean ± sample standard deviation over the n files of a run")
    notes.append("numbers in %; recall is text->image; rsum = sum of R@1/5/10 in both directions")
    notes.append(
        f"@50/80/90%: precision achieved here by the thresholds calibrated on {_calibration_name(results)} for "
        "that precision; cal.err: mean |achieved - promised| over all calibrated levels; rel.spread: "
        "(p95 - p5) of the per-query best thresholds / (mean positive - mean negative score), a ratio; OPIS: "
        "variance across queries of their TPR/TNR harmonic mean, averaged over the calibration range, x 10^3 "
        "(lower = more threshold-consistent)"
    )
    return "\n".join(out + notes + format_paired(results))


def format_markdown(results: list[dict], paired: bool = True) -> str:
    """The side-by-side table of ``results``, its notes and (``paired``) the CE − SS lines of :func:`format_paired`;
    a caller with a better unit for its paired tests (feature draws) leaves them out and writes its own."""
    rows = _rows(group_runs(results))
    dis = _distractor_title(results)
    cal = _calibration_name(results)
    headers = (
        ["Run", "n", "PR AUC", "R@1", "R@5", "R@10"]
        + [f"R{h} dis." for _, h in _DIS]
        + ["rsum"]
        + [f"Prec. {h} ({cal} thr.)" for _, h in _ACHIEVED]
        + ["Mean cal. err.", "Rel. thr. spread", "OPIS (×10⁻³)"]
    )
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    out += ["| " + " | ".join([name, n, *cells]) + " |" for name, n, cells in rows]
    notes = (
        f'Numbers in %; recall is text->image; "dis.": {dis}; rsum = R@1/5/10 summed over both directions; '
        "mean ± sample std over the n evaluation files of a run. "
        f"Prec. @p%: precision achieved by the threshold calibrated on {cal} for precision p; mean cal. err.: "
        "mean |achieved − promised| over all calibrated levels; rel. thr. spread: (p95 − p5) of the per-query "
        "best-F1 thresholds over (mean positive − mean negative score), a ratio; OPIS: operating-point "
        "inconsistency of the caption queries (variance across queries of their TPR/TNR harmonic mean, averaged "
        "over the calibration range), ×10⁻³, lower = more threshold-consistent."
    )
    lines = format_paired(results) if paired else []
    return "\n".join(out) + "\n\n" + notes + "\n" + "".join(f"\n{p}\n" for p in lines)


def _seed(doc: dict):
    """The run's pairing key: ``config.train.seed``, or ``(feature_draw, seed)`` for a run that names its draw of
    frozen features (seeds repeat across draws)."""
    train = (doc.get("config") or {}).get("train") if isinstance(doc.get("config"), dict) else None
    if not isinstance(train, dict):
        return None
    return (train["feature_draw"], train.get("seed")) if "feature_draw" in train else train.get("seed")


def _ttest_p(a: np.ndarray, b: np.ndarray) -> float | None:
    """Two-sided paired t-test p-value (scipy), None without scipy, with fewer than 2 pairs, or when undefined."""
    if len(a) < 2:
        return None
    try:
        from scipy import stats
    except ImportError:
        return None
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        p = float(stats.ttest_rel(a, b).pvalue)
    return p if np.isfinite(p) else None


def paired_difference(results: list[dict], a: str, b: str, key: str) -> dict:
    """Run ``a`` minus run ``b`` on the summary figure ``key``, seed by seed.

    Files are grouped by ``run_name``. They are paired by ``config.train.seed`` when every file of both runs has
    one (unique within its run; seeds present in one run only are left out), otherwise by their order. Pairs
    where either value is missing are dropped. Returns ``{"a", "b", "key", "paired_by" ("seed" | "order"),
    "n", "mean", "std" (sample std of the differences, None for n < 2), "p_value" (two-sided paired t-test,
    ``scipy.stats.ttest_rel``; None without scipy, for n < 2 or zero variance), "pairs": [{"seed", "a", "b"}]}``.
    """
    groups = group_runs(results)
    for name in (a, b):
        if name not in groups:
            raise ValueError(f"paired_difference: no run named {name!r} (runs: {', '.join(groups)})")
    docs_a, docs_b = groups[a], groups[b]
    seeds_a, seeds_b = [_seed(d) for d in docs_a], [_seed(d) for d in docs_b]
    by_seed = (
        None not in seeds_a + seeds_b
        and len(set(map(repr, seeds_a))) == len(seeds_a)
        and len(set(map(repr, seeds_b))) == len(seeds_b)
    )
    if by_seed:
        index_b = {repr(s): d for s, d in zip(seeds_b, docs_b, strict=True)}
        matched = [(s, da, index_b[repr(s)]) for s, da in zip(seeds_a, docs_a, strict=True) if repr(s) in index_b]
    else:
        matched = [(None, da, db) for da, db in zip(docs_a, docs_b, strict=False)]
    pairs = [{"seed": s, "a": da["summary"].get(key), "b": db["summary"].get(key)} for s, da, db in matched]
    pairs = [p for p in pairs if p["a"] is not None and p["b"] is not None]
    va = np.asarray([p["a"] for p in pairs], np.float64)
    vb = np.asarray([p["b"] for p in pairs], np.float64)
    diff = va - vb
    return {
        "a": a,
        "b": b,
        "key": key,
        "paired_by": "seed" if by_seed else "order",
        "n": len(pairs),
        "mean": float(diff.mean()) if len(pairs) else None,
        "std": float(diff.std(ddof=1)) if len(pairs) > 1 else None,
        "p_value": _ttest_p(va, vb),
        "pairs": pairs,
    }


def format_paired(results: list[dict]) -> list[str]:
    """ "CE − SS" lines (percentage points) when runs CrossExampleSoftmax and SampledSoftmax are both present."""
    a, b, label = _PAIRED
    groups = group_runs(results)
    if a not in groups or b not in groups:
        return []
    lines = []
    for key, name in _PAIRED_KEYS:
        d = paired_difference(results, a, b, key)
        if not d["n"]:
            lines.append(f"{label} {name}: no pairs with both values")
            continue
        std = "" if d["std"] is None else f" ± {100 * d['std']:.2f}"
        p = "p n/a" if d["p_value"] is None else f"p = {d['p_value']:.3g}"
        lines.append(
            f"{label} {name}: {100 * d['mean']:+.2f}{std} points "
            f"(n = {d['n']} paired by {d['paired_by']}, paired t-test {p})"
        )
    return lines


def plot_reliability_report(results: list[dict], path: str) -> str:
    """Promised vs achieved precision of every run (mean over its files, band = sample std); returns ``path``."""
    from ce_retrieval.evaluation.plots import plot_reliability

    curves = {}
    for name, docs in group_runs(results).items():
        achieved: dict[float, list[float]] = {}
        for d in docs:
            levels = ((d.get("metrics") or {}).get("transfer") or {}).get("levels") or {}
            for entry in levels.values():
                if entry and entry.get("precision") is not None:
                    achieved.setdefault(float(entry["promised"]), []).append(float(entry["precision"]))
        if achieved:
            promised = sorted(achieved)
            curves[name] = {
                "promised": promised,
                "achieved": [float(np.mean(achieved[c])) for c in promised],
                "std": [float(np.std(achieved[c], ddof=1)) if len(achieved[c]) > 1 else None for c in promised],
            }
    if not curves:
        raise SystemExit("report: no calibration transfer in the given files (evaluate with --calibration_split)")
    splits = {str(d.get("split")).rstrip("/").split("/")[-1] for d in results if d.get("split")}
    where = f" on {splits.pop()}" if len(splits) == 1 else ""
    title = f"Thresholds calibrated on {_calibration_name(results)}: promised vs achieved precision{where}"
    return plot_reliability(curves, path, title=title)


def plot_report(results: list[dict], path: str) -> str:
    from ce_retrieval.evaluation.plots import plot_pr_curves

    curves = {}
    for name, docs in group_runs(results).items():
        runs = []
        for d in docs:
            cal = d.get("metrics", {}).get("calibration") or {}
            if cal.get("curve"):
                runs.append(
                    {
                        "recall": cal["curve"]["recall"],
                        "precision": cal["curve"]["precision"],
                        "pr_auc": cal.get("pr_auc"),
                    }
                )
        if runs:
            curves[name] = runs
    if not curves:
        raise SystemExit("report: no PR curves in the given files")
    return plot_pr_curves(curves, path)
