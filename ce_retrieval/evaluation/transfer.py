"""Does a calibrated threshold keep its promise? Threshold transfer across splits and per-query thresholds.

A threshold ``t_c`` chosen on the validation split for a target precision ``c`` (``global_pr_auc``'s
``threshold_at_precision``) is a promise about unseen data: "of the pairs scoring ``>= t_c``, a fraction ``c`` is
relevant". :func:`threshold_transfer` measures it on another split (the test split) over all ``N x M`` pairs,
positive iff the ids are equal, scores ``s_ij = <q_i, d_j>`` in float32 exactly as ``global_pr_auc`` makes them:

    TP(t) = #{positives with s >= t},   FP(t) = #{negatives with s >= t},   P = #positives,
    achieved(c) = TP(t_c) / (TP(t_c) + FP(t_c)),   recall(c) = TP(t_c) / P,
    error(c) = |achieved(c) - c|,   shortfall(c) = max(0, c - achieved(c)).

Plotting achieved against promised precision over many levels ``c`` gives a reliability diagram: a calibrated
model lies on the diagonal. One streamed pass over row blocks counts every threshold at once: the distinct
thresholds are sorted, each score's ``searchsorted`` position is histogrammed with ``bincount``, and suffix sums
give ``#{s >= t}`` for all of them (positives counted the same way from their own entries).

A global threshold can only work if the queries agree on where "relevant" starts (the paper's Figure 4 argument).
:func:`per_query_thresholds` gives each query i with ``P_i >= 1`` relevant documents its own best threshold: with
its scores sorted in descending order and ``TP_k`` relevant among the top k,

    F1_i(k) = 2 TP_k / (k + P_i),

maximised over the cutoffs k that do not split a run of equal scores; the threshold is the k-th score. The width
of the band holding 90% of these thresholds, ``spread = p95 - p5``, is one number for Figure 4 (narrow for a
calibrated model), and ``relative_spread = spread / (mean positive score - mean negative score)`` compares models
with different score scales. Only cutoffs at a relevant document's score can be best (adding irrelevant documents
lowers F1), so per row block the rows are sorted once and each positive's ``#{row scores >= s}`` and
``#{row positives >= s}`` come from ``searchsorted`` on order-preserving integer keys of (row, score).

Memory is O(N + M + P + block) for both; the default block is about 2M scores, as in ``global_pr_auc``.
"""

from __future__ import annotations

import math

import numpy as np

from ce_retrieval.evaluation._arrays import block_rows, check_pair, required_positive_pairs
from ce_retrieval.evaluation.calibration import DEFAULT_BLOCK_ELEMENTS

__all__ = [
    "RELIABILITY_LEVELS",
    "SUMMARY_LEVELS",
    "calibration_summary",
    "counts_at_thresholds",
    "per_query_thresholds",
    "reliability_curve",
    "threshold_transfer",
]

# Promised precisions of the reliability diagram: 0.05, 0.10, ..., 0.95 (the standard 0.5 / 0.8 / 0.9 included).
RELIABILITY_LEVELS = (
    0.05,
    0.1,
    0.15,
    0.2,
    0.25,
    0.3,
    0.35,
    0.4,
    0.45,
    0.5,
    0.55,
    0.6,
    0.65,
    0.7,
    0.75,
    0.8,
    0.85,
    0.9,
    0.95,
)
# The levels reported as flat headline figures (``achieved_precision_0.9`` ...).
SUMMARY_LEVELS = (0.5, 0.8, 0.9)


def _level_key(level: float) -> str:
    return f"{level:g}"


def _parse_levels(thresholds) -> list[tuple[str, float, float | None]]:
    """``[(key, promised, threshold or None)]`` sorted by promised precision.

    Values may be scores or ``precision_thresholds`` entries (``{"threshold": ...}``); keys floats or strings.
    """
    if not isinstance(thresholds, dict):
        raise TypeError(
            f"thresholds must be a dict {{precision level: score threshold or None}}, got {type(thresholds).__name__}"
        )
    levels = {}
    for key, value in thresholds.items():
        try:
            promised = float(key)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"threshold level {key!r} is not a number") from exc
        if not 0.0 <= promised <= 1.0:
            raise ValueError(f"threshold level {key!r} is not a precision in [0, 1]")
        if isinstance(value, dict):
            value = value.get("threshold")
        if value is not None:
            value = float(value)
            if math.isnan(value):
                raise ValueError(f"threshold for level {key!r} is NaN (use None for a level that was not reachable)")
        name = _level_key(promised)
        if name in levels:
            raise ValueError(f"threshold level {key!r} is given twice")
        levels[name] = (name, promised, value)
    return sorted(levels.values(), key=lambda item: item[1])


def _float32_ceil(t: float) -> np.float32:
    """The smallest float32 ``>= t``: for float32 scores s, ``s >= t`` iff ``s >= _float32_ceil(t)``."""
    with np.errstate(over="ignore"):
        t32 = np.float32(t)
    if float(t32) < t:
        t32 = np.nextafter(t32, np.float32(np.inf))
    return t32


def _blocks(n: int, rows: int, pos_rows: np.ndarray):
    """``(r0, r1, a, z)`` per row block: query rows ``r0:r1`` and their positives ``a:z`` (pos_rows is sorted)."""
    starts = np.searchsorted(pos_rows, np.arange(0, n + rows, rows))
    return [(r0, min(n, r0 + rows), int(starts[b]), int(starts[b + 1])) for b, r0 in enumerate(range(0, n, rows))]


def _counts(cuts: np.ndarray, q, d, rows: int, pos_rows, pos_cols) -> tuple[np.ndarray, np.ndarray]:
    """``(#{s >= cuts[j]}, #{relevant s >= cuts[j]})`` for ascending float32 ``cuts``, in one pass of row blocks."""
    k = len(cuts)
    all_hist = np.zeros(k + 1, np.int64)  # all_hist[i]: scores s with #{cuts <= s} == i
    pos_hist = np.zeros(k + 1, np.int64)
    if k:
        dt = np.ascontiguousarray(d.T)
        for r0, r1, a, z in _blocks(len(q), rows, pos_rows):
            s = q[r0:r1] @ dt  # the same float32 products as global_pr_auc's row blocks
            all_hist += np.bincount(np.searchsorted(cuts, s.reshape(-1), side="right"), minlength=k + 1)
            if z > a:
                pos = s[pos_rows[a:z] - r0, pos_cols[a:z]]
                pos_hist += np.bincount(np.searchsorted(cuts, pos, side="right"), minlength=k + 1)
    # #{s >= cuts[j]} = #{i > j} in the histograms: suffix sums from j + 1.
    return np.cumsum(all_hist[::-1])[::-1][1:], np.cumsum(pos_hist[::-1])[::-1][1:]


def counts_at_thresholds(
    thresholds, query_emb, doc_emb, query_ids, doc_ids, block_size: int | None = None
) -> dict[float, tuple[int, int]]:
    """``{t: (pairs with s >= t, relevant pairs with s >= t)}`` for many thresholds in one exact pass over the
    split's pairs (what :func:`threshold_transfer` counts per level; for studies that check many thresholds)."""
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    pos_rows, pos_cols = required_positive_pairs(qids, dids, "counts_at_thresholds")
    wanted = [float(t) for t in thresholds]
    cuts = np.unique(np.array([_float32_ceil(t) for t in wanted], np.float32))
    all_ge, pos_ge = _counts(cuts, q, d, block_rows(block_size, len(d), DEFAULT_BLOCK_ELEMENTS), pos_rows, pos_cols)
    at = {float(c): (int(a), int(p)) for c, a, p in zip(cuts, all_ge, pos_ge, strict=True)}
    return {t: at[float(_float32_ceil(t))] for t in wanted}


def threshold_transfer(thresholds, query_emb, doc_emb, query_ids, doc_ids, block_size: int | None = None) -> dict:
    """The precision each calibrated threshold achieves on this split, counted exactly over all pairs.

    Args:
      thresholds: ``{level: threshold}``: a promised precision (float, or a string such as ``"0.9"``) and the
        score threshold chosen for it on another split, None where that split could not reach the level --
        ``global_pr_auc(...)["threshold_at_precision"]`` (or its ``precision_thresholds``).
      query_emb, doc_emb, query_ids, doc_ids: the split to measure, as for ``global_pr_auc``.
      block_size: query rows per matmul block (default: about 2M scores per block).

    Returns ``{"levels": {"0.9": entry or None}, "mean_abs_error", "max_abs_error", "num_levels",
    "num_unreachable", "num_empty", "num_pairs", "num_positives"}`` with levels in ascending order. An entry is
    ``{"promised", "threshold", "precision", "recall", "num_predicted", "num_true_positives", "error",
    "shortfall"}``; a level without a threshold (unreachable on the calibration split) is None. When no pair
    of this split reaches the threshold, nothing is predicted and the precision is undefined: ``precision``,
    ``error`` and ``shortfall`` are None (``recall`` is 0) and the level counts in ``num_empty``. The two error
    summaries are over the levels with an achieved precision (None when there is none).
    """
    levels = _parse_levels(thresholds)
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    n, m = len(q), len(d)
    rows = block_rows(block_size, m, DEFAULT_BLOCK_ELEMENTS)
    pos_rows, pos_cols = required_positive_pairs(qids, dids, "threshold_transfer")
    num_pos = len(pos_rows)

    cuts = np.unique(np.array([_float32_ceil(t) for _, _, t in levels if t is not None], np.float32))
    all_ge, pos_ge = _counts(cuts, q, d, rows, pos_rows, pos_cols)

    out_levels: dict[str, dict | None] = {}
    errors = []
    for name, promised, t in levels:
        if t is None:
            out_levels[name] = None
            continue
        j = int(np.searchsorted(cuts, _float32_ceil(t)))
        tp, predicted = int(pos_ge[j]), int(all_ge[j])
        precision = tp / predicted if predicted else None
        entry = {
            "promised": promised,
            "threshold": t,
            "precision": precision,
            "recall": tp / num_pos,
            "num_predicted": predicted,
            "num_true_positives": tp,
            "error": None if precision is None else abs(precision - promised),
            "shortfall": None if precision is None else max(0.0, promised - precision),
        }
        if precision is not None:
            errors.append(entry["error"])
        out_levels[name] = entry
    num_unreachable = sum(t is None for _, _, t in levels)
    return {
        "levels": out_levels,
        "mean_abs_error": float(np.mean(errors)) if errors else None,
        "max_abs_error": float(np.max(errors)) if errors else None,
        "num_levels": len(levels),
        "num_unreachable": num_unreachable,
        "num_empty": len(levels) - num_unreachable - len(errors),
        "num_pairs": int(n * m),
        "num_positives": int(num_pos),
    }


def _ordered_keys(x: np.ndarray) -> np.ndarray:
    """int32 keys with the order of the float32 values ``x`` (equal values, -0.0 and 0.0 too, get equal keys)."""
    bits = (np.asarray(x, np.float32) + np.float32(0.0)).view(np.int32)  # a new array; -0.0 + 0.0 == +0.0
    np.bitwise_xor(bits, np.int32(0x7FFFFFFF), out=bits, where=bits < 0)  # negative floats: reverse their order
    return bits


def _row_keys(keys32: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """int64 keys ordered by (row, score): ``row * 2^32 + key + 2^31`` (``rows`` broadcasts against ``keys32``)."""
    out = keys32.astype(np.int64)
    out += (np.asarray(rows, np.int64) << 32) + (1 << 31)
    return out


def per_query_thresholds(
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    block_size: int | None = None,
    return_per_query: bool = False,
) -> dict:
    """Each query's own best-F1 threshold and how widely those thresholds spread (see the module docstring).

    Args:
      query_emb, doc_emb, query_ids, doc_ids: the split, as for ``global_pr_auc``. Queries without a relevant
        document have no best threshold and are left out of the statistics.
      block_size: query rows per block (default: about 2M scores per block).
      return_per_query: also return ``"per_query": {"threshold", "f1"}``, float arrays ``[N]`` (NaN for the
        queries without a relevant document). Not JSON; for analysis and tests.

    The best cutoff of query i maximises ``F1_i = 2 TP / (#predicted + P_i)`` over thresholds ``t`` (predict
    ``s >= t``); among equal F1 the higher threshold wins. Returns ``{"thresholds": {"mean", "std", "min",
    "p5", "p25", "median", "p75", "p95", "max"}, "spread" (p95 - p5), "relative_spread" (spread over the gap
    between the mean positive and the mean negative score of all pairs; None when that gap is not positive),
    "mean_positive_score", "mean_negative_score" (None without negatives), "mean_f1" (of the per-query best),
    "num_queries" (queries with a relevant document), "num_queries_without_relevant"}``.
    """
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    n, m = len(q), len(d)
    rows = block_rows(block_size, m, DEFAULT_BLOCK_ELEMENTS)
    pos_rows, pos_cols = required_positive_pairs(qids, dids, "per_query_thresholds")
    num_pos = len(pos_rows)
    dt = np.ascontiguousarray(d.T)
    best_t = np.full(n, np.nan, np.float32)
    best_f1 = np.full(n, np.nan, np.float64)
    score_sum = pos_sum = 0.0
    for r0, r1, a, z in _blocks(n, rows, pos_rows):
        s = q[r0:r1] @ dt
        score_sum += float(s.sum(dtype=np.float64))
        if z == a:
            continue
        r = pos_rows[a:z] - r0  # block-local row of each positive (ascending)
        v = s[r, pos_cols[a:z]]
        pos_sum += float(v.sum(dtype=np.float64))
        keys = _ordered_keys(s)
        keys.sort(axis=1)
        sorted_rows = _row_keys(keys, np.arange(r1 - r0)[:, None]).reshape(-1)  # ascending: rows, then scores
        del keys
        key = _row_keys(_ordered_keys(v), r)
        num_ge = m - (np.searchsorted(sorted_rows, key, side="left") - r * m)  # row scores >= v
        pos_sorted = np.sort(key)
        row_end = np.searchsorted(pos_sorted, (r + 1).astype(np.int64) << 32, side="left")
        tp_ge = row_end - np.searchsorted(pos_sorted, key, side="left")  # the row's positives >= v
        row_pos = row_end - np.searchsorted(pos_sorted, r.astype(np.int64) << 32, side="left")  # P_i
        f1 = 2.0 * tp_ge / (num_ge + row_pos)
        order = np.lexsort((-v, -f1, r))  # per row: best F1 first, then the highest threshold
        first = order[np.flatnonzero(np.r_[True, r[order][1:] != r[order][:-1]])]
        best_t[r0 + r[first]] = v[first]
        best_f1[r0 + r[first]] = f1[first]

    has = ~np.isnan(best_f1)
    t = best_t[has].astype(np.float64)
    p5, p25, p50, p75, p95 = np.percentile(t, [5, 25, 50, 75, 95])
    num_neg = n * m - num_pos
    mean_pos = pos_sum / num_pos
    mean_neg = (score_sum - pos_sum) / num_neg if num_neg else None
    gap = None if mean_neg is None else mean_pos - mean_neg
    spread = float(p95 - p5)
    out = {
        "thresholds": {
            "mean": float(t.mean()),
            "std": float(t.std()),
            "min": float(t.min()),
            "p5": float(p5),
            "p25": float(p25),
            "median": float(p50),
            "p75": float(p75),
            "p95": float(p95),
            "max": float(t.max()),
        },
        "spread": spread,
        "relative_spread": spread / gap if gap is not None and gap > 0 else None,
        "mean_positive_score": float(mean_pos),
        "mean_negative_score": None if mean_neg is None else float(mean_neg),
        "mean_f1": float(best_f1[has].mean()),
        "num_queries": int(has.sum()),
        "num_queries_without_relevant": int(n - has.sum()),
    }
    if return_per_query:
        out["per_query"] = {"threshold": best_t, "f1": best_f1}
    return out


def reliability_curve(transfer: dict) -> dict:
    """``{"promised": [...], "achieved": [...]}`` of a :func:`threshold_transfer` result, for ``plot_reliability``
    (levels without an achieved precision are left out)."""
    points = [e for e in (transfer.get("levels") or {}).values() if e and e.get("precision") is not None]
    points.sort(key=lambda e: e["promised"])
    return {"promised": [e["promised"] for e in points], "achieved": [e["precision"] for e in points]}


def calibration_summary(transfer: dict | None, query_thresholds: dict | None, levels=SUMMARY_LEVELS) -> dict:
    """Flat headline figures: ``achieved_precision_<c>``, ``achieved_recall_<c>``, ``calibration_error_<c>``
    for ``c`` in ``levels``, ``mean_calibration_error`` (over all transferred levels), ``threshold_spread`` and
    ``relative_threshold_spread``; None where the figure is unavailable."""
    out = {}
    entries = (transfer or {}).get("levels") or {}
    for level in levels:
        key = _level_key(float(level))
        entry = entries.get(key)
        out[f"achieved_precision_{key}"] = entry["precision"] if entry else None
        out[f"achieved_recall_{key}"] = entry["recall"] if entry else None
        out[f"calibration_error_{key}"] = entry["error"] if entry else None
    out["mean_calibration_error"] = (transfer or {}).get("mean_abs_error")
    out["threshold_spread"] = (query_thresholds or {}).get("spread")
    out["relative_threshold_spread"] = (query_thresholds or {}).get("relative_spread")
    return out
