"""Operating-point inconsistency (OPIS): how much one global threshold means different things to different queries.

After Zhang et al. (ICLR 2024, "Threshold-consistent margin loss for open-world deep metric learning"), adapted to
retrieval. A global threshold tau predicts "relevant" for every pair with ``s_ij = <q_i, d_j> >= tau``. Query i
with ``P_i >= 1`` relevant and ``N_i >= 1`` irrelevant documents gets, at tau,

    TPR_i(tau) = #{relevant j: s_ij >= tau} / P_i,      TNR_i(tau) = #{irrelevant j: s_ij < tau} / N_i,
    U_i(tau)   = 2 TPR_i TNR_i / (TPR_i + TNR_i)        (harmonic mean; 0 when both are 0),

and over the T such queries (the others have no TPR or no TNR and are left out, counted in the result)

    OPIS = 1 / (tau_max - tau_min) * integral_{tau_min}^{tau_max} Var_i[U_i(tau)] d tau,
    Var_i[U_i] = (1/T) sum_i (U_i - mean_i U_i)^2                (population variance, as in the paper).

0 when every query's utility curve is the same (one threshold serves all queries equally); at most 1/4.

The calibration range ``[tau_min, tau_max]`` is that of the operating points a user ships: the span of the
thresholds that reach the precision levels ``RELIABILITY_LEVELS`` (0.05 ... 0.95, as calibrated by ``evaluate``)
on the evaluated split's own global precision-recall curve (:func:`calibration_range`; the lowest threshold with
precision >= c, ``global_pr_auc``'s ``threshold_at_precision``). It is measured in each model's own score scale,
so models with different scales compare.

The integral is exact. Each U_i is piecewise constant and changes only where tau passes one of row i's scores, so
``S1(tau) = sum_i U_i`` and ``S2(tau) = sum_i U_i^2`` are step functions whose jumps sit at the scores inside
``(tau_min, tau_max)``: per row block, those entries are sorted by (row, score), each row's counts after every
drop give ``U_i`` and its jump, and at the end all jumps are sorted once by score; between consecutive breakpoints
``Var = S2/T - (S1/T)^2`` is constant. No grid, no loop over queries. Memory is O(N + M + block + B) with B the
number of pairs scoring inside the range; for the calibration range B <= P / 0.05 (at ``tau_min`` the global
precision is at least 0.05, so at most 20 pairs per relevant pair score above it).
"""

from __future__ import annotations

import math

import numpy as np

from ce_retrieval.evaluation._arrays import block_rows, check_pair, positive_pairs
from ce_retrieval.evaluation.calibration import DEFAULT_BLOCK_ELEMENTS

__all__ = ["calibration_range", "operating_point_inconsistency", "opis", "opis_summary"]


def calibration_range(threshold_at_precision: dict) -> dict | None:
    """``{"threshold_min", "threshold_max", "level_min", "level_max"}``: the span of the thresholds calibrated for
    the precision levels (``{"0.9": score or None}``), with the levels at its ends; None when fewer than two
    distinct thresholds exist (no range to integrate over)."""
    reached = []
    for key, t in (threshold_at_precision or {}).items():
        if isinstance(t, dict):
            t = t.get("threshold")
        if t is not None and math.isfinite(float(t)):
            reached.append((float(t), float(key)))
    if len({t for t, _ in reached}) < 2:
        return None
    lo, hi = min(reached), max(reached)
    return {"threshold_min": lo[0], "threshold_max": hi[0], "level_min": lo[1], "level_max": hi[1]}


def _utility(tp, fp, num_pos, num_neg) -> np.ndarray:
    """Harmonic mean of TPR = tp / P and TNR = 1 - fp / N (0 where both are 0), float64."""
    tpr = tp / np.maximum(num_pos, 1)  # rows without relevant or irrelevant documents are masked by the caller
    tnr = 1.0 - fp / np.maximum(num_neg, 1)
    total = tpr + tnr
    return np.divide(2.0 * tpr * tnr, total, out=np.zeros_like(total, dtype=np.float64), where=total > 0)


def _block_jumps(s, lo, hi, qids_b, dids, rel_count, num_pos, num_neg, valid):
    """One row block: (U at tau_min+ of each row, breakpoint scores, jumps of U and of U^2 at them).

    ``rel_count[i]`` is the number of relevant documents of row i scoring above ``lo``; rows not ``valid`` are
    left out (their utility is 0 here and they have no breakpoints).
    """
    above = s > lo  # float64 comparison: exact for any float tau
    fp0 = above.sum(axis=1) - rel_count
    u0 = np.where(valid, _utility(rel_count, fp0, num_pos, num_neg), 0.0)
    above &= s < hi
    above &= valid[:, None]
    r, c = np.nonzero(above)
    v = s[r, c]
    order = np.lexsort((v, r))  # by row, then ascending score: the order in which entries drop out as tau grows
    r, c, v = r[order], c[order], v[order]
    rel = (qids_b[r] == dids[c]).astype(np.int64)
    idx = np.arange(len(r))
    first = np.searchsorted(r, r, side="left")  # index of the row's first breakpoint
    cum_rel = np.cumsum(rel)
    dropped_rel = cum_rel - (cum_rel[first] - rel[first])
    dropped_irr = idx - first + 1 - dropped_rel
    u_after = _utility(rel_count[r] - dropped_rel, fp0[r] - dropped_irr, num_pos[r], num_neg[r])
    u_before = np.where(idx == first, u0[r], np.roll(u_after, 1))
    return u0, v.astype(np.float64), u_after - u_before, u_after**2 - u_before**2


def opis(query_emb, doc_emb, query_ids, doc_ids, threshold_range, block_size: int | None = None) -> dict:
    """Exact OPIS of the scores ``Q D^T`` over ``threshold_range = (tau_min, tau_max)`` (see the module docstring).

    Args:
      query_emb, doc_emb, query_ids, doc_ids: as for ``global_pr_auc`` (a pair is relevant iff the ids are equal).
      threshold_range: ``(tau_min, tau_max)`` with ``tau_min < tau_max``, or a :func:`calibration_range` dict.
      block_size: query rows per matmul block (default: about 2M scores per block).

    Returns ``{"opis", "mean_utility" (the average over tau of mean_i U_i: low OPIS with low utility means every
    query is served equally badly), "threshold_min", "threshold_max", "num_queries" (T, the queries counted),
    "num_queries_without_relevant", "num_queries_without_irrelevant", "num_breakpoints"}``; ``opis`` and
    ``mean_utility`` are None when no query has both kinds of documents.
    """
    lo, hi = _check_range(threshold_range)
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    n, m = len(q), len(d)
    rows = block_rows(block_size, m, DEFAULT_BLOCK_ELEMENTS)
    pos_rows, pos_cols = positive_pairs(qids, dids)
    num_pos = np.bincount(pos_rows, minlength=n)
    num_neg = m - num_pos
    valid = (num_pos > 0) & (num_neg > 0)
    starts = np.searchsorted(pos_rows, np.arange(0, n + rows, rows))
    dt = np.ascontiguousarray(d.T)
    lo64, hi64 = np.float64(lo), np.float64(hi)
    s1 = s2 = 0.0
    points, jumps1, jumps2 = [], [], []
    for b, r0 in enumerate(range(0, n, rows)):
        r1 = min(n, r0 + rows)
        s = q[r0:r1] @ dt
        a, z = starts[b], starts[b + 1]
        pr = pos_rows[a:z] - r0
        rel_count = np.bincount(pr[s[pr, pos_cols[a:z]] > lo64], minlength=r1 - r0)
        u0, v, j1, j2 = _block_jumps(
            s, lo64, hi64, qids[r0:r1], dids, rel_count, num_pos[r0:r1], num_neg[r0:r1], valid[r0:r1]
        )
        s1 += float(u0.sum())
        s2 += float((u0**2).sum())
        points.append(v)
        jumps1.append(j1)
        jumps2.append(j2)
    t = int(valid.sum())
    v = np.concatenate(points)
    out = {
        "opis": None,
        "mean_utility": None,
        "threshold_min": lo,
        "threshold_max": hi,
        "num_queries": t,
        "num_queries_without_relevant": int((num_pos == 0).sum()),
        "num_queries_without_irrelevant": int((num_neg == 0).sum()),
        "num_breakpoints": len(v),
    }
    if t == 0:
        return out
    order = np.argsort(v, kind="stable")
    sum1 = np.concatenate([[s1], s1 + np.cumsum(np.concatenate(jumps1)[order])])
    sum2 = np.concatenate([[s2], s2 + np.cumsum(np.concatenate(jumps2)[order])])
    length = np.diff(np.concatenate([[lo], v[order], [hi]]))  # constant pieces of S1, S2 between breakpoints
    mean = sum1 / t
    var = np.maximum(sum2 / t - mean**2, 0.0)  # clip the rounding of E[U^2] - E[U]^2 at 0
    out["opis"] = float(np.dot(var, length) / (hi - lo))
    out["mean_utility"] = float(np.dot(mean, length) / (hi - lo))
    return out


def operating_point_inconsistency(
    query_emb, doc_emb, query_ids, doc_ids, threshold_at_precision: dict, block_size: int | None = None
) -> dict:
    """OPIS in both directions over the calibration range of ``threshold_at_precision`` (this split's thresholds
    for ``RELIABILITY_LEVELS``): ``{"range": calibration_range(...), "t2i": opis(queries = captions), "i2t":
    opis(queries = images)}``, the last two None when there is no range. Both directions share the range: they
    threshold the same pairs."""
    span = calibration_range(threshold_at_precision)
    if span is None:
        return {"range": None, "t2i": None, "i2t": None}
    return {
        "range": span,
        "t2i": opis(query_emb, doc_emb, query_ids, doc_ids, span, block_size),
        "i2t": opis(doc_emb, query_emb, doc_ids, query_ids, span, block_size),
    }


def opis_summary(both: dict | None) -> dict:
    """Flat figures of an :func:`operating_point_inconsistency` result: ``opis`` (caption queries, the direction of
    the other calibration figures) and ``i2t_opis`` (image queries); None where unavailable."""
    both = both or {}
    return {
        "opis": (both.get("t2i") or {}).get("opis"),
        "i2t_opis": (both.get("i2t") or {}).get("opis"),
    }


def _check_range(threshold_range) -> tuple[float, float]:
    if isinstance(threshold_range, dict):
        threshold_range = (threshold_range.get("threshold_min"), threshold_range.get("threshold_max"))
    try:
        lo, hi = (float(t) for t in threshold_range)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"threshold_range must be (tau_min, tau_max), got {threshold_range!r}") from exc
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"threshold_range must be finite with tau_min < tau_max, got ({lo}, {hi})")
    return lo, hi
