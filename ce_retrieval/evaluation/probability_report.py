"""Score -> probability calibration of several runs side by side (printed by ``ce-retrieval report``).

For each run (files sharing a ``run_name`` are seeds; cells are mean ± standard deviation over them), from the
evaluation JSON's ``metrics.probability`` (:func:`ce_retrieval.evaluation.probability.reliability` of the map fitted
on the calibration split, measured on the evaluated split), the figures that separate two maps: the Brier and
log-loss skill against the base rate with Murphy's resolution and reliability terms, how many pairs each map
predicts >= 0.5 and >= 0.9 and the precision observed there, and the calibration error per query (over its pairs
predicted >= 0.1, with its noise floor), over all queries and per query group (caption length, number of relevant
images when that varies, quartile of the highest score). The plain ECE stays in the JSON but not here: over all
pairs it is bounded by about twice the share of relevant pairs for any map. The paper's claim predicts that CE's
map holds for each query better: a per-query error closer to its floor, and evenly so across groups.
:func:`plot_probability_report` draws the reliability diagrams of all runs in one figure.
"""

from __future__ import annotations

import warnings

import numpy as np

from ce_retrieval.evaluation.probability import (
    CAPTION_LENGTH_GROUPS,
    CONFIDENT_LEVELS,
    PROBABILITY_AXES,
    RELEVANT_GROUPS,
    TOP_SCORE_GROUPS,
)

__all__ = ["format_probability", "plot_probability_report"]


def _by_run(results: list[dict]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for doc in results:
        prob = (doc.get("metrics") or {}).get("probability")
        if prob:
            runs.setdefault(doc.get("run_name", "run"), []).append(prob)
    return runs


def _cell(values, scale: float = 100.0, digits: int = 2, spread: bool = True) -> str:
    """Mean (± sample std over seeds, with ``spread``) of the values that are not None, times ``scale``; "–" when
    none is."""
    v = np.array([x for x in values if x is not None], np.float64) * scale
    if len(v) == 0:
        return "–"
    return f"{v.mean():,.{digits}f}" + (f" ± {v.std(ddof=1):,.{digits}f}" if spread and len(v) > 1 else "")


def _get(prob: dict, *path):
    for key in path:
        prob = (prob or {}).get(key)
    return prob


def _relative(prob: dict, key: str):
    """A Brier term as a share of the uncertainty ``obar (1 - obar)``, the Brier score of the base rate."""
    value, unc = _get(prob, "scores", key), _get(prob, "scores", "uncertainty")
    return value / unc if value is not None and unc else None


def _scores_table(runs: dict[str, list[dict]]) -> list[str]:
    head = ["run", "seeds", "Brier skill", "log-loss skill", "resolution", "reliability"]
    head += [f"{what} ≥ {c:g}" for c in CONFIDENT_LEVELS for what in ("pairs", "precision")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, probs in runs.items():
        cells = [name, str(len(probs))]
        cells += [_cell(_get(p, "scores", k) for p in probs) for k in ("brier_skill", "log_loss_skill")]
        cells += [_cell(_relative(p, k) for p in probs) for k in ("resolution", "reliability")]
        for c in CONFIDENT_LEVELS:
            cells.append(_cell((_get(p, "confident", f"{c:g}", "num_pairs") for p in probs), 1.0, 0))
            cells.append(_cell(_get(p, "confident", f"{c:g}", "precision") for p in probs))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# per-query grouping -> its groups in order
GROUP_ORDER = {
    "by_caption_length": [name for _, name in CAPTION_LENGTH_GROUPS],
    "by_relevant": RELEVANT_GROUPS,
    "by_top_score": TOP_SCORE_GROUPS,
}


def _groups(runs: dict[str, list[dict]], grouping: str) -> list[str]:
    """The groups of ``grouping`` that any run has, in :data:`GROUP_ORDER`."""
    present = {g for probs in runs.values() for p in probs for g in _get(p, "per_query", grouping) or {}}
    return [g for g in GROUP_ORDER[grouping] if g in present]


def _per_query_table(runs: dict[str, list[dict]]) -> list[str]:
    columns = [("all", None, "all queries")]
    columns += [("by_caption_length", g, f"{g} words") for g in _groups(runs, "by_caption_length")]
    relevant = _groups(runs, "by_relevant")
    if len(relevant) > 1:
        columns += [("by_relevant", g, f"{g} relevant") for g in relevant]
    columns += [("by_top_score", g, f"top score {g}") for g in _groups(runs, "by_top_score")]
    head = ["run"] + [label for _, _, label in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, probs in runs.items():
        cells = [name]
        for key, g, _ in columns:
            path = ("per_query", key) if g is None else ("per_query", key, g)
            error = _cell((_get(p, *path, "error") for p in probs), digits=1)
            cells.append(f"{error} ({_cell((_get(p, *path, 'floor') for p in probs), digits=1, spread=False)})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def format_probability(results: list[dict]) -> str | None:
    """Markdown tables of the probability maps of several runs: the proper scores' skill, resolution and reliability
    (% of the base rate's Brier score), the pairs predicted >= 0.5 / 0.9 and their observed precision; then the
    per-query calibration error (points) with its noise floor, over all queries and per query group. None when no
    result carries ``metrics.probability`` (evaluated without a calibration split)."""
    runs = _by_run(results)
    if not runs:
        return None
    lines = [
        "P(relevant | score) fitted on the calibration split, measured on the evaluated split. Skill: 1 - score / "
        "score of the base rate (%, higher is better); resolution and reliability: Murphy's Brier terms as % of the "
        "base rate's Brier score (skill ~ resolution - reliability); pairs predicted ≥ c and the precision observed "
        "among them (%):",
        "",
        *_scores_table(runs),
        "",
        "Calibration error per query over its pairs predicted ≥ 0.1 (points, mean over the group's queries; in "
        "brackets the mean noise floor, what a perfectly calibrated map scores there):",
        "",
        *_per_query_table(runs),
    ]
    return "\n".join(lines)


def plot_probability_report(results: list[dict], path: str) -> str:
    """Predicted vs observed relevance per probability bin for every run (mean over seeds, band = std)."""
    from ce_retrieval.evaluation.plots import plot_reliability

    curves = {}
    for name, probs in _by_run(results).items():
        pred = np.array([[np.nan if v is None else v for v in p["bins"]["predicted"]] for p in probs], np.float64)
        obs = np.array([[np.nan if v is None else v for v in p["bins"]["observed"]] for p in probs], np.float64)
        with warnings.catch_warnings():  # a bin empty in every seed: NaN, skipped by the plot
            warnings.simplefilter("ignore", RuntimeWarning)
            mean_obs, mean_pred = np.nanmean(obs, axis=0), np.nanmean(pred, axis=0)
            std = np.nanstd(obs, axis=0, ddof=1) if len(probs) > 1 else None
        curves[name] = {
            "promised": mean_pred.tolist(),
            "achieved": [None if np.isnan(v) else float(v) for v in mean_obs],
            "std": None if std is None else std.tolist(),
        }
    if not curves:
        raise SystemExit("report: no probability calibration in the given files (evaluate with --calibration_split)")
    return plot_reliability(
        curves, path, title="P(relevant | score) fitted on validation: predicted vs observed", axes=PROBABILITY_AXES
    )
