"""Confidence bounds of a proportion X / n whose events come in clusters (pairs of one query, hits of one query).

``clopper_pearson`` is the exact one-sided binomial bound; with real-valued ``x`` and ``n`` it takes an effective
sample size. Clustered events are not independent: the cluster-robust variance of X / n over K units with
per-unit counts (x_u, n_u) is

    V = K / (K - 1) * sum_u (x_u - p n_u)^2 / n^2,          p = X / n,

the design effect ``deff = V / (p (1 - p) / n)`` (at least 1), and the bound is Clopper-Pearson at the effective
size n / deff (Korn & Graubard 1998). Used by the guaranteed thresholds (``evaluation.guarantee``) and by the
threshold search's tuning (``serving.threshold_search``), which must not depend on each other.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = ["clopper_pearson", "cluster_variance", "clustered_lower_bound", "two_way"]


def clopper_pearson(x, n, alpha, upper: bool) -> np.ndarray:
    """One-sided Clopper-Pearson bound of a proportion with ``x`` events in ``n`` trials (real-valued x and n
    allowed: an effective sample size). Lower: Beta(x, n - x + 1).ppf(alpha), 0 at x = 0; upper:
    Beta(x + 1, n - x).ppf(1 - alpha), 1 at x = n."""
    x, n = np.asarray(x, np.float64), np.asarray(n, np.float64)
    x = np.clip(x, 0.0, n)
    with np.errstate(invalid="ignore", divide="ignore"):
        if upper:
            out = np.where(x >= n, 1.0, stats.beta.ppf(1.0 - alpha, x + 1.0, np.maximum(n - x, 1e-12)))
        else:
            out = np.where(x <= 0, 0.0, stats.beta.ppf(alpha, np.maximum(x, 1e-12), n - x + 1.0))
    return np.nan_to_num(out, nan=1.0 if upper else 0.0)


def cluster_variance(x_unit: np.ndarray, n_unit: np.ndarray, n: int) -> np.ndarray:
    """Cluster-robust variance of X / n from per-unit counts ``x_unit`` [K, G] and trial counts ``n_unit`` [K]
    (0 with fewer than two units holding a trial: no between-unit spread to measure)."""
    keep = n_unit > 0
    x_unit, n_unit = x_unit[keep], n_unit[keep]
    k = len(n_unit)
    if k < 2 or n == 0:
        return np.zeros(x_unit.shape[1])
    p = x_unit.sum(0) / n
    resid = x_unit - n_unit[:, None] * p[None, :]
    return (k / (k - 1)) * np.sum(resid * resid, axis=0) / float(n) ** 2


def two_way(var_a: np.ndarray, var_b: np.ndarray, x, n: int) -> np.ndarray:
    """Two-way cluster-robust variance of X / n (Cameron, Gelbach & Miller 2011): ``V_a + V_b - V_ab``, where the
    intersection term is taken at the level of single events, ``p (1 - p) / n`` (the binomial variance). Without
    it an independent sample would count its variance twice (design effect 2); the cells where the two
    clusterings meet hold at most a few pairs, whose own correlation this leaves in, so the result is at least
    the CGM estimate's. Never below zero."""
    p = np.asarray(x, np.float64) / max(float(n), 1.0)
    return np.maximum(np.asarray(var_a) + np.asarray(var_b) - p * (1.0 - p) / max(float(n), 1.0), 0.0)


def clustered_lower_bound(x_unit, n_unit, confidence: float) -> float | None:
    """Lower ``confidence`` bound of sum(x_u) / sum(n_u) with the units as clusters: Clopper-Pearson at the
    effective size n / deff (module docstring). None when no unit has a trial."""
    x_unit, n_unit = np.asarray(x_unit, np.float64), np.asarray(n_unit, np.float64)
    n = float(n_unit.sum())
    if n == 0:
        return None
    p = float(x_unit.sum()) / n
    var = float(cluster_variance(x_unit[:, None], n_unit, n)[0])
    binom = p * (1.0 - p) / n
    deff = max(1.0, var / binom) if binom > 0 else 1.0
    return float(clopper_pearson(p * n / deff, n / deff, 1.0 - confidence, upper=False))
