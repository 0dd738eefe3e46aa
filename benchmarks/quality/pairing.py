"""Paired differences between two objectives' runs, with the feature draw as the unit of variance.

Runs with the same (feature draw, seed) share frozen features, initial heads and batch order, so ``a − b`` is read
per unit. Several draws of the frozen features vary what a head seed cannot: with more than one draw, the per-draw
mean differences (over seeds) d̄_k are the units, tested against 0 by a one-sample t-test with n = draws,
t = mean(d̄) / (sd(d̄) / √n); with one draw the seeds are the units (a paired t-test).
"""

from __future__ import annotations

import numpy as np


def run_unit(doc: dict) -> tuple:
    """A run's pairing key: (feature draw, seed); runs with the same key share initial weights and batches."""
    train = doc["config"]["train"]
    return (train.get("feature_draw", 0), train["seed"])


def paired_by_draw(docs_a: list, docs_b: list, key: str) -> dict | None:
    """``a − b`` on ``summary[key]`` paired by (feature draw, seed): ``{"diff", "sd", "p", "units", "by",
    "seed_sd", "draw_diffs"}`` (``sd``: between the units; ``seed_sd``: the mean sd over seeds within a draw;
    ``draw_diffs``: the per-draw mean differences), or None without pairs."""
    from scipy import stats

    b = {run_unit(d): d["summary"].get(key) for d in docs_b}
    diffs: dict = {}
    for d in docs_a:
        u, va = run_unit(d), d["summary"].get(key)
        if va is not None and b.get(u) is not None:
            diffs.setdefault(u[0], []).append(va - b[u])
    if not diffs:
        return None
    by_draw = len(diffs) > 1
    units = np.asarray([np.mean(v) for v in diffs.values()] if by_draw else next(iter(diffs.values())))
    within = [np.std(v, ddof=1) for v in diffs.values() if len(v) > 1]
    p = None
    if len(units) > 1 and np.std(units) > 0:
        p = float(stats.ttest_1samp(units, 0.0).pvalue)
    return {
        "diff": float(units.mean()),
        "sd": float(units.std(ddof=1)) if len(units) > 1 else None,
        "p": p,
        "units": len(units),
        "by": "feature draw" if by_draw else "seed",
        "seed_sd": float(np.mean(within)) if within else None,
        "draw_diffs": {int(k): float(np.mean(v)) for k, v in sorted(diffs.items())},
    }
