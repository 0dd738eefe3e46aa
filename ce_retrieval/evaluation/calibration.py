"""Global calibration: one precision-recall curve over every query x document pair (paper Table 1 "PR AUC", Fig. 4).

A single global threshold t predicts "relevant" for every pair with score ``s_ij = <q_i, d_j> >= t``. With
P positives (relevant pairs), for each threshold t

    TP(t) = #{positives with s >= t},   FP(t) = #{negatives with s >= t},
    precision(t) = TP / (TP + FP),      recall(t) = TP / P.

The curve has one point per distinct score (equal scores form one threshold, as in scikit-learn). Both summaries
are exact and identical to scikit-learn on the flattened pairs:

    average precision  AP  = sum_k (R_k - R_{k-1}) P_k             (sklearn.metrics.average_precision_score)
    trapezoidal PR-AUC AUC = sum_k (R_k - R_{k-1}) (P_k + P_{k-1}) / 2
                                                                     (sklearn.metrics.auc on precision_recall_curve)

Only thresholds equal to a positive score move recall, so both need, for each distinct positive score u_k,
the number of negatives scoring ``>= u_k`` and ``> u_k`` (the point just before u_k on the curve). Streaming:

1. pass 1 computes the positive scores exactly as pass 2's row blocks ``Q[r0:r1] D^T`` will (same float32 bits;
   only the needed columns are multiplied, and pass 2 verifies every one and falls back to full blocks if the
   BLAS rounds differently): O(P) memory -> sorted distinct positive scores u.
2. pass 2 recomputes the same blocks and counts every score against u without storing it: a uniform float32
   grid over [u_0, u_K-1] (monotone, applied to u with the same arithmetic) gives each score its interval
   ``#{u < x}`` and tie flag from two table look-ups and one comparison; one ``bincount`` per chunk adds them up
   (see ``_Grid``). The positives' own entries, counted like every other score, are subtracted at the end.

Memory is O(N + M + P + block + num_bins); time one matmul plus about ten vector passes per score, spread over
``num_threads`` threads while the next block is multiplied.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ce_retrieval.evaluation._arrays import block_rows, check_pair, required_positive_pairs

__all__ = ["global_pr_auc", "threshold_for_precision"]

DEFAULT_BLOCK_ELEMENTS = 1 << 21  # scores per matmul block (8 MiB of float32)
_CHUNK = 1 << 17  # scores per counting chunk (stays in cache)


class _Grid:
    """Maps scores x to ``key = 2 * #{u < x} + [x == u]`` with a few vector passes and one ``bincount``.

    Cells of a uniform grid over ``[u_0, u_K-1]`` (G cells, ``cell(x) = clip(floor((x - u_0) * scale))`` in
    float32, monotone in x and applied to u with the same arithmetic) hold at most one distinct positive score
    in almost all cases. For a cell c with ``below[c]`` positive values in lower cells and first value ``v[c]``
    (+inf when it holds none), ``#{u < x} = below[c] + [x > v[c]]`` and the tie flag is ``[x == v[c]]``, so

        key = 2 below[c] + [x > v[c]] + [x >= v[c]].

    The rare cells holding two or more distinct positives map to a spill key, and their scores are placed with
    an exact ``searchsorted``.
    """

    def __init__(self, u: np.ndarray, num_bins: int):
        k = len(u)
        self.u = u
        self.size = int(num_bins) if num_bins else int(min(1 << 17, max(1 << 12, 1 << int(np.ceil(np.log2(32 * k))))))
        span = float(u[-1]) - float(u[0])
        self.lo = np.float32(u[0])
        self.scale = np.float32((self.size - 1) / span) if span > 0 else np.float32(0.0)
        if not np.isfinite(self.scale):
            self.scale = np.float32(np.finfo(np.float32).max / 4)
        self.top = np.float32(self.size - 1)
        cells = self._cells(u, np.empty(k, np.float32), np.empty(k, np.int32)).copy()
        per_cell = np.bincount(cells, minlength=self.size)
        below2 = (2 * np.searchsorted(cells, np.arange(self.size), side="left")).astype(np.int32)
        self.spill = 2 * k + 2
        below2[per_cell > 1] = self.spill
        first = np.full(self.size, np.inf, np.float32)
        first[cells[::-1]] = u[::-1]  # the smallest u of each cell
        # One 8-byte entry per cell (below2, first): a single gather fetches both (one cache miss, not two).
        self.table = np.empty((self.size, 2), np.int32)
        self.table[:, 0] = below2
        self.table[:, 1] = first.view(np.int32)
        self.table = self.table.reshape(-1).view(np.int64)

    def _cells(self, x, fbuf, ibuf):
        np.subtract(x, self.lo, out=fbuf)
        np.multiply(fbuf, self.scale, out=fbuf)
        np.clip(fbuf, np.float32(0), self.top, out=fbuf)
        np.copyto(ibuf, fbuf, casting="unsafe")  # truncation == floor for the non-negative values
        return ibuf

    def counter(self) -> _Counter:
        """Per-thread buffers and counts (length ``2K + 3``) for :meth:`count`."""
        return _Counter(np.zeros(self.spill + 1, np.int64))

    def count(self, x: np.ndarray, c: _Counter) -> None:
        """Add the keys of the scores ``x`` to ``c.counts``, one cache-sized chunk at a time."""
        for c0 in range(0, len(x), _CHUNK):
            self._count_chunk(x[c0 : c0 + _CHUNK], c)

    def _count_chunk(self, x: np.ndarray, c: _Counter) -> None:
        n = len(x)
        cells = self._cells(x, c.fbuf[:n], c.ibuf[:n])
        packed, flag = c.pbuf[:n], c.bbuf[:n]
        np.take(self.table, cells, out=packed, mode="clip")  # mode "clip" is unbuffered (cells are in range)
        pair = packed.view(np.int32).reshape(n, 2)
        key, v = pair[:, 0], pair[:, 1].view(np.float32)
        np.greater(x, v, out=flag)
        np.add(key, flag, out=key)
        np.greater_equal(x, v, out=flag)
        np.add(key, flag, out=key)
        hist = np.bincount(key, minlength=self.spill)
        c.counts[: self.spill] += hist[: self.spill]
        if len(hist) > self.spill:  # scores in cells holding several positives: place exactly
            exact = x[key >= self.spill]
            k = np.searchsorted(self.u, exact, side="left")
            tie = exact == np.append(self.u, np.float32(np.inf))[k]
            c.counts[: self.spill] += np.bincount(2 * k + tie, minlength=self.spill)


class _Counter:
    """Scratch buffers of one counting thread and its running counts."""

    def __init__(self, counts: np.ndarray):
        self.counts = counts
        self.fbuf = np.empty(_CHUNK, np.float32)
        self.ibuf = np.empty(_CHUNK, np.int32)
        self.pbuf = np.empty(_CHUNK, np.int64)
        self.bbuf = np.empty(_CHUNK, bool)


class _NotReproducible(Exception):
    """A score from pass 1 differs in the last bit from the same pair's score in pass 2."""


def _block_positives(q, dt, r0, r1, rows_b, cols_b, narrow: bool) -> np.ndarray:
    """Scores of the positive pairs ``(rows_b, cols_b)`` of query rows ``r0:r1``, as pass 2 will compute them.

    ``narrow=False`` multiplies the whole block ``Q[r0:r1] D^T`` exactly like pass 2. ``narrow=True`` multiplies
    only the needed columns (padded to a multiple of 64, where BLAS uses its full-width kernels), which is ~M/rows
    times cheaper and in practice bit-identical; pass 2 checks every value and falls back to ``narrow=False``.
    """
    m = dt.shape[1]
    cols = np.unique(cols_b)
    if not narrow or len(cols) * 2 >= m or r1 - r0 < 8:  # few rows: BLAS switches to matrix-vector kernels
        return (q[r0:r1] @ dt)[rows_b - r0, cols_b]
    pad = min(m - len(cols), (-len(cols)) % 64)
    if pad:
        free = np.ones(m, bool)
        free[cols] = False
        cols_all = np.concatenate([cols, np.flatnonzero(free)[:pad]])
    else:
        cols_all = cols
    sub = q[r0:r1] @ np.ascontiguousarray(dt[:, cols_all])
    return sub[rows_b - r0, np.searchsorted(cols, cols_b)]


def _curve_indices(recall: np.ndarray, num_points: int) -> np.ndarray:
    """Indices of about ``num_points`` curve points spread evenly in recall (first and last kept)."""
    if len(recall) <= num_points:
        return np.arange(len(recall))
    picks = np.searchsorted(recall, np.linspace(0.0, 1.0, num_points), side="left")
    return np.unique(np.concatenate([[0], np.clip(picks, 0, len(recall) - 1), [len(recall) - 1]]))


def threshold_for_precision(thresholds, precision, recall, target: float) -> dict | None:
    """The lowest curve threshold whose precision is at least ``target`` (the operating point of largest recall).

    ``thresholds`` are distinct positive scores in descending order. Any score between the next lower positive
    score and this one gives the same recall with more false positives, so this is the threshold to ship.
    Returns ``{"threshold", "precision", "recall"}`` or None when no threshold reaches ``target``.
    """
    ok = np.flatnonzero(np.asarray(precision) >= target)
    if len(ok) == 0:
        return None
    k = ok[-1]
    return {"threshold": float(thresholds[k]), "precision": float(precision[k]), "recall": float(recall[k])}


def _two_passes(q, dt, rows, pos_rows, pos_cols, num_bins, threads, narrow):
    """Pass 1 (positive scores) and pass 2 (every score counted against them); see the module docstring.

    Pass 2 counts each matmul block with ``threads`` threads (NumPy releases the GIL in these loops) while the
    next block is multiplied. Returns ``(pos_scores, counts, top1_doc, top1_score)``.
    """
    n = len(q)
    starts = np.searchsorted(pos_rows, np.arange(0, n + rows, rows))
    blocks = [(r0, min(n, r0 + rows), starts[b], starts[b + 1]) for b, r0 in enumerate(range(0, n, rows))]
    pos_scores = np.empty(len(pos_rows), np.float32)
    for r0, r1, a, z in blocks:
        if z > a:
            pos_scores[a:z] = _block_positives(q, dt, r0, r1, pos_rows[a:z], pos_cols[a:z], narrow)
    u = np.unique(pos_scores)  # ascending distinct positive scores
    grid = _Grid(u, num_bins)
    counters = [grid.counter() for _ in range(threads)]
    top1_doc = np.empty(n, np.int64)
    top1_score = np.empty(n, np.float32)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending = []
        for r0, r1, a, z in blocks:
            s = q[r0:r1] @ dt  # overlaps with the counting of the previous block
            for f in pending:
                f.result()
            if not np.array_equal(s[pos_rows[a:z] - r0, pos_cols[a:z]], pos_scores[a:z]):
                if narrow:
                    raise _NotReproducible
                raise RuntimeError("the matrix product is not deterministic across passes; cannot count ties exactly")
            flat = s.reshape(-1)
            step = -(-len(flat) // threads)
            pending = [pool.submit(grid.count, flat[t * step : (t + 1) * step], counters[t]) for t in range(threads)]
            top1_doc[r0:r1] = np.argmax(s, axis=1)
            top1_score[r0:r1] = s[np.arange(r1 - r0), top1_doc[r0:r1]]
        for f in pending:
            f.result()
    return pos_scores, sum(c.counts for c in counters), top1_doc, top1_score


def global_pr_auc(
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    block_size: int | None = None,
    target_precisions=(0.5, 0.8, 0.9),
    curve_points: int = 512,
    num_bins: int | None = None,
    num_threads: int | None = None,
) -> dict:
    """Exact global average precision and trapezoidal PR-AUC over all ``N x M`` pairs, streamed in row blocks.

    Args:
      query_emb, doc_emb: ``[N, d]`` and ``[M, d]`` embeddings (scores are their float32 dot products).
      query_ids, doc_ids: ``[N]`` and ``[M]`` ids; a pair is positive iff the ids are equal. Queries with no
        relevant document take part with negatives only (a calibrated model scores them low everywhere).
      block_size: query rows per matmul block (default: about 2M scores per block).
      target_precisions: precisions for which the threshold of largest recall is reported.
      curve_points: size of the downsampled PR curve returned for plotting.
      num_bins: cells of the counting grid (speed only; the result does not depend on it). Default: 32 per
        distinct positive score, between 2^12 and 2^17.
      num_threads: threads counting scores (default: min(4, CPU count)).

    Returns a dict: ``average_precision``, ``pr_auc``, ``num_pairs``, ``num_positives``, ``num_queries``,
    ``best_f1`` (``threshold``, ``f1``, ``precision``, ``recall``, ``queries_top1_above``: share of queries whose
    top-scoring document clears the threshold, ``queries_top1_relevant_above``: ... and is relevant),
    ``precision_thresholds`` (``{"0.9": {...} or None}``), ``threshold_at_precision`` (the same thresholds, flat:
    ``{"0.9": score or None}``, what ``ce_retrieval.build`` stores in an index manifest) and ``curve``
    (``recall``, ``precision``, ``threshold``
    lists, recall ascending, starting at the (0, 1) point scikit-learn adds).
    """
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    n, m = len(q), len(d)
    if num_bins is not None and int(num_bins) < 2:
        raise ValueError(f"num_bins must be at least 2, got {num_bins}")
    rows = block_rows(block_size, m, DEFAULT_BLOCK_ELEMENTS)
    dt = np.ascontiguousarray(d.T)

    pos_rows, pos_cols = required_positive_pairs(qids, dids, "global_pr_auc")
    num_pos = len(pos_rows)
    num_neg = n * m - num_pos

    threads = int(num_threads) if num_threads else min(4, os.cpu_count() or 1)
    try:
        pos_scores, counts, top1_doc, top1_score = _two_passes(q, dt, rows, pos_rows, pos_cols, num_bins, threads, True)
    except _NotReproducible:  # this BLAS gives the narrow product other bits: use full blocks in pass 1 too
        pos_scores, counts, top1_doc, top1_score = _two_passes(
            q, dt, rows, pos_rows, pos_cols, num_bins, threads, False
        )
    u, pos_count = np.unique(pos_scores, return_counts=True)
    k_pos = len(u)
    # Every positive was counted as a score tied with its own u_k: remove them, leaving negatives only.
    counts[1 : 2 * k_pos : 2] -= pos_count
    idx_count = counts[0 : 2 * k_pos + 2 : 2] + counts[1 : 2 * k_pos + 2 : 2]
    tie_count = counts[1 : 2 * k_pos + 2 : 2]
    if idx_count.sum() != num_neg or np.any(counts < 0) or counts[-1] != 0:
        raise RuntimeError("global_pr_auc: internal count mismatch (please report with the inputs' shapes)")

    # Curve at the distinct positive scores, in descending threshold order (k = K-1 ... 0).
    neg_gt = (num_neg - np.cumsum(idx_count))[:k_pos]  # negatives > u_k
    neg_ge = neg_gt + tie_count[:k_pos]  # negatives >= u_k
    pos_ge = num_pos - np.concatenate([[0], np.cumsum(pos_count)[:-1]])  # positives >= u_k
    pos_gt = pos_ge - pos_count
    desc = slice(None, None, -1)
    thresholds, tp, fp, tp_prev, fp_prev, step = (
        u[desc],
        pos_ge[desc],
        neg_ge[desc],
        pos_gt[desc],
        neg_gt[desc],
        pos_count[desc],
    )
    precision = tp / (tp + fp)
    recall = tp / num_pos
    prev_total = tp_prev + fp_prev
    prev_precision = np.where(prev_total == 0, 1.0, tp_prev / np.maximum(prev_total, 1))
    step_recall = step / num_pos
    average_precision = float(np.sum(step_recall * precision))
    pr_auc = float(np.sum(step_recall * (precision + prev_precision) / 2.0))

    f1 = 2.0 * precision * recall / (precision + recall)
    best = int(np.argmax(f1))
    t_best = thresholds[best]
    above = top1_score >= t_best
    best_f1 = {
        "threshold": float(t_best),
        "f1": float(f1[best]),
        "precision": float(precision[best]),
        "recall": float(recall[best]),
        "queries_top1_above": float(np.mean(above)),
        "queries_top1_relevant_above": float(np.mean(above & (dids[top1_doc] == qids))),
    }
    targets = {f"{t:g}": threshold_for_precision(thresholds, precision, recall, t) for t in target_precisions}

    keep = _curve_indices(recall, max(2, int(curve_points)))
    curve = {
        "recall": [0.0] + recall[keep].tolist(),
        "precision": [1.0] + precision[keep].tolist(),
        "threshold": [None] + thresholds[keep].astype(float).tolist(),
    }
    return {
        "average_precision": average_precision,
        "pr_auc": pr_auc,
        "num_pairs": int(n * m),
        "num_positives": int(num_pos),
        "num_queries": int(n),
        "num_documents": int(m),
        "num_queries_without_relevant": int(n - len(np.unique(pos_rows))),
        "best_f1": best_f1,
        "precision_thresholds": targets,
        # The flat form the serving index stores in its manifest: {"0.9": score or None}.
        "threshold_at_precision": {k: (v["threshold"] if v else None) for k, v in targets.items()},
        "curve": curve,
    }
