"""Score -> probability calibration of several runs side by side (printed by ``ce-retrieval report``).

For each run (files sharing a ``run_name`` are seeds; cells are mean ± standard deviation over them), from the
evaluation JSON's ``metrics.probability`` (:func:`ce_retrieval.evaluation.probability.reliability` of the map fitted
on the calibration split, measured on the evaluated split): the expected calibration error over all pairs, over
the pairs predicted at least 0.1 (where a user reads a probability), and the latter per query group: queries by
the quartile of their highest score, and by their number of relevant images when that varies. The paper's claim
predicts that CE's map transfers across queries better: lower and more even ECE across groups.
:func:`plot_probability_report` draws the reliability diagrams of all runs in one figure.
"""

from __future__ import annotations

import warnings

import numpy as np

from ce_retrieval.evaluation.probability import PROBABILITY_AXES

__all__ = ["format_probability", "plot_probability_report"]


def _by_run(results: list[dict]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for doc in results:
        prob = (doc.get("metrics") or {}).get("probability")
        if prob:
            runs.setdefault(doc.get("run_name", "run"), []).append(prob)
    return runs


def _cell(values) -> str:
    v = np.array([x for x in values if x is not None], np.float64)
    if len(v) == 0:
        return "–"
    return f"{100 * v.mean():.2f}" + (f" ± {100 * v.std(ddof=1):.2f}" if len(v) > 1 else "")


def format_probability(results: list[dict]) -> str | None:
    """A Markdown table of ECE (in points) per run, overall / p >= 0.1 / per query group; None when no result
    carries ``metrics.probability`` (evaluated without a calibration split)."""
    runs = _by_run(results)
    if not runs:
        return None
    columns = [("ece_by_top_score", g, f"top score {g}") for g in ("Q1 (lowest)", "Q2", "Q3", "Q4 (highest)")]
    relevant = sorted({g for probs in runs.values() for p in probs for g in p["ece_by_group"]})
    if len(relevant) > 1:
        columns += [("ece_by_group", g, f"{g} relevant") for g in relevant]
    head = ["run", "seeds", "ECE", "ECE (p ≥ 0.1)"] + [name for _, _, name in columns]
    lines = [
        "P(relevant | score) fitted on the calibration split, expected calibration error on the evaluated split "
        "(points; lower is better; per query group: pairs predicted p ≥ 0.1):",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, probs in runs.items():
        cells = [name, str(len(probs)), _cell(p["ece"] for p in probs), _cell(p["ece_top"] for p in probs)]
        cells += [_cell(((p.get(key) or {}).get(g) or {}).get("ece_top") for p in probs) for key, g, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
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
