"""Input checks and pair bookkeeping shared by the retrieval and calibration metrics.

Embeddings arrive as NumPy arrays or tensors (any float dtype, e.g. float16 from a mixed-precision tower) and
are scored as float32 dot products ``S = Q D^T``. Ids are rank-1 arrays; query i is relevant to document j iff
``query_ids[i] == doc_ids[j]`` (ids may repeat on either side), unless the relevant pairs are given as
``positives = (rows, cols)`` (:func:`check_positives`): a caption relevant to several images that other captions
share only in part, which id equality cannot express.
"""

from __future__ import annotations

import numpy as np

from ce_retrieval.search.arrays import as_embeddings, check_same_dim, rows_per_block


def as_ids(x, n: int, name: str) -> np.ndarray:
    """A rank-1 id array of length ``n``, or a ValueError naming ``name``."""
    if hasattr(x, "numpy"):
        x = x.numpy()
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a rank-1 vector of ids, got shape {arr.shape}")
    if len(arr) != n:
        raise ValueError(f"{name} has {len(arr)} entries but the embeddings have {n} rows")
    return arr


def check_pair(query_emb, doc_emb, query_ids, doc_ids):
    """Validated ``(Q, D, query_ids, doc_ids)``: float32 embeddings of one width and matching id vectors."""
    q = as_embeddings(query_emb, "query_emb")
    d = as_embeddings(doc_emb, "doc_emb")
    check_same_dim(q, d)
    if len(q) == 0 or len(d) == 0:
        raise ValueError(f"need at least one query and one document, got {len(q)} queries and {len(d)} documents")
    qi = as_ids(query_ids, len(q), "query_ids")
    di = as_ids(doc_ids, len(d), "doc_ids")
    if qi.dtype.kind != di.dtype.kind and not (qi.dtype.kind in "iu" and di.dtype.kind in "iu"):
        raise ValueError(f"query_ids ({qi.dtype}) and doc_ids ({di.dtype}) are of different kinds")
    return q, d, qi, di


def positive_pairs(query_ids: np.ndarray, doc_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All relevant pairs ``(i, j)`` with ``query_ids[i] == doc_ids[j]``, sorted by i (a sort-merge join,
    O(N + M + P))."""
    order = np.argsort(doc_ids, kind="stable")
    sorted_ids = doc_ids[order]
    start = np.searchsorted(sorted_ids, query_ids, side="left")
    count = np.searchsorted(sorted_ids, query_ids, side="right") - start
    rows = np.repeat(np.arange(len(query_ids), dtype=np.int64), count)
    first = np.repeat(np.cumsum(count) - count, count)
    cols = order[np.repeat(start, count) + (np.arange(len(rows), dtype=np.int64) - first)]
    return rows, cols.astype(np.int64)


def required_positive_pairs(query_ids: np.ndarray, doc_ids: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`positive_pairs`, or a ValueError naming ``where`` when there are none (the pair metrics need one)."""
    rows, cols = positive_pairs(query_ids, doc_ids)
    if len(rows) == 0:
        raise ValueError(f"{where}: no query shares an id with any document, so there are no positive pairs")
    return rows, cols


def check_positives(positives, n: int, m: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Given relevant pairs ``(rows, cols)`` of an ``n x m`` pair matrix as int64 arrays sorted by row (then
    column), or a ValueError naming ``where``: equal lengths, in range, no pair twice, at least one pair."""
    try:
        rows, cols = (np.asarray(a).reshape(-1) for a in positives)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: positives must be a pair (rows, cols) of index arrays") from None
    if len(rows) != len(cols) or (len(rows) and (rows.dtype.kind not in "iu" or cols.dtype.kind not in "iu")):
        raise ValueError(
            f"{where}: positives must be two integer arrays of one length, got {len(rows)} and {len(cols)}"
        )
    if len(rows) == 0:
        raise ValueError(f"{where}: no positive pairs given")
    if rows.min() < 0 or rows.max() >= n or cols.min() < 0 or cols.max() >= m:
        raise ValueError(f"{where}: positives out of range for {n} queries x {m} documents")
    order = np.lexsort((cols, rows))
    rows, cols = rows[order].astype(np.int64), cols[order].astype(np.int64)
    if np.any((np.diff(rows) == 0) & (np.diff(cols) == 0)):
        raise ValueError(f"{where}: a positive pair is given twice")
    return rows, cols


def relevance_block(positives: tuple[np.ndarray, np.ndarray], r0: int, r1: int, m: int) -> np.ndarray:
    """``bool [r1 - r0, m]``: True at the relevant pairs of query rows ``r0:r1`` (``positives`` as
    :func:`check_positives` returns them)."""
    rows, cols = positives
    a, z = np.searchsorted(rows, [r0, r1])
    out = np.zeros((r1 - r0, m), bool)
    out[rows[a:z] - r0, cols[a:z]] = True
    return out


def block_rows(block_size, num_cols: int, block_elements: int) -> int:
    """Query rows per score block: ``block_size`` when given (a positive number), else about ``block_elements``
    scores' worth (:func:`rows_per_block`)."""
    rows = int(block_size) if block_size else rows_per_block(num_cols, block_elements)
    if rows < 1:
        raise ValueError(f"block_size must be a positive number of rows, got {block_size}")
    return rows
