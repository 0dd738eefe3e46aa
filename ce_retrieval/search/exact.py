"""Exact top-k search by chunked matrix products, the reference every approximate searcher is measured against.

For queries Q [N, d] and a gallery D [M, d], ``exact_search`` returns for each query the k documents of largest
score ``s_ij = <q_i, d_j>`` (float32), ordered by score, ties broken by the lower document index (so the result
is the first k columns of a stable descending sort, and independent of the chunking). Memory is bounded by one
``rows x cols`` score block: queries are processed in row blocks and, for large galleries, documents in column
blocks whose partial top-k lists are merged.

A *search function* is any callable ``search_fn(query_emb, k) -> (indices [N, k] int, scores [N, k])`` over a
fixed gallery (index -1 marks a missing result); ``ExactSearch(doc_emb)`` is the exact one and a ScaNN searcher
(``ce_retrieval.search.ann.ScannSearch``) is a drop-in replacement.
"""

from __future__ import annotations

import numpy as np

from ce_retrieval.search.arrays import as_embeddings, check_same_dim, rows_per_block

__all__ = ["ExactSearch", "exact_search"]

DEFAULT_BLOCK_ELEMENTS = 1 << 22  # scores per block (16 MiB of float32)


def _top_k_block(s: np.ndarray, k: int, col0: int) -> tuple[np.ndarray, np.ndarray]:
    """Stable top-k of each row of a score block: (global indices, scores), score descending then index ascending."""
    rows, cols = s.shape
    if k >= cols:
        order = np.argsort(-s, axis=1, kind="stable")
        return order + col0, np.take_along_axis(s, order, axis=1)
    part = np.argpartition(s, cols - k, axis=1)[:, cols - k :]
    kth = np.take_along_axis(s, part, axis=1).min(axis=1, keepdims=True)  # k-th largest value per row
    greater = s > kth
    need = k - greater.sum(axis=1, keepdims=True)  # how many ties at the k-th value to keep, lowest index first
    equal = s == kth
    keep = greater | (equal & (np.cumsum(equal, axis=1) <= need))
    idx = np.nonzero(keep)[1].reshape(rows, k)  # ascending column order within each row
    val = np.take_along_axis(s, idx, axis=1)
    order = np.argsort(-val, axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1) + col0, np.take_along_axis(val, order, axis=1)


def _merge(idx_a, val_a, idx_b, val_b, k):
    """Top-k of two candidate lists per row by (score descending, index ascending)."""
    idx = np.concatenate([idx_a, idx_b], axis=1)
    val = np.concatenate([val_a, val_b], axis=1)
    order = np.lexsort((idx, -val), axis=1)[:, :k]
    return np.take_along_axis(idx, order, axis=1), np.take_along_axis(val, order, axis=1)


def exact_search(
    query_emb, doc_emb, k: int, block_elements: int = DEFAULT_BLOCK_ELEMENTS
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` documents per query: ``(indices [N, k'] int64, scores [N, k'] float32)``, ``k' = min(k, M)``."""
    return ExactSearch(doc_emb, block_elements)(query_emb, k)


class ExactSearch:
    """A search function over a fixed gallery: ``ExactSearch(doc_emb)(query_emb, k) -> (indices, scores)``.

    The gallery is checked (and converted to float32) once, here, not at every call: the project's one exact
    top-k (the serving index uses it for brute-force galleries and exact fallbacks)."""

    def __init__(self, doc_emb, block_elements: int = DEFAULT_BLOCK_ELEMENTS):
        self.doc_emb = as_embeddings(doc_emb, "doc_emb")
        self.block_elements = int(block_elements)

    def __len__(self) -> int:
        return len(self.doc_emb)

    def __call__(self, query_emb, k: int):
        q = as_embeddings(query_emb, "query_emb")
        d = self.doc_emb
        check_same_dim(q, d)
        if int(k) < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        n, m = len(q), len(d)
        k = min(int(k), m)
        indices = np.empty((n, k), np.int64)
        scores = np.empty((n, k), np.float32)
        if n == 0:
            return indices, scores
        # Column blocks only when a single row of scores exceeds the budget; each keeps at least k columns.
        block_elements = self.block_elements
        cols = m if m <= block_elements else max(k, block_elements)
        rows = rows_per_block(cols, block_elements)
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            best = None
            for c0 in range(0, m, cols):
                c1 = min(m, c0 + cols)
                # d[c0:c1].T is a view: BLAS reads the transpose in place, the gallery is never copied
                cand = _top_k_block(q[r0:r1] @ d[c0:c1].T, min(k, c1 - c0), c0)
                best = cand if best is None else _merge(*best, *cand, k)
            indices[r0:r1], scores[r0:r1] = best
        return indices, scores
