"""Top-k relevancy: Recall@K in both directions, with distractors, and the recall lost by approximate search.

Queries are captions, documents are images; query i is relevant to document j iff their ids are equal.

    text->image R@K = mean over captions i of  1[ some relevant image is among the K highest-scoring images ]
    image->text R@K = mean over images j   of  1[ some caption of j is among the K highest-scoring captions ]
    rsum            = sum over both directions and K in ks of R@K        (the VSE literature's score)

"Among the K highest" is the first K results of the search function; the exact one breaks score ties by the
lower index (a stable descending sort), so results do not depend on chunking. A caption whose id matches no
gallery image, and an image without any caption, cannot be retrieved correctly: they are left out of the mean
and their number is reported (``t2i_excluded``, ``i2t_excluded``).

With distractors (paper Table 1, right) the gallery is the test images followed by extra images relevant to no
caption; text->image R@1/5/10/100 is reported.
"""

from __future__ import annotations

import numpy as np

from ce_retrieval.evaluation._arrays import check_pair
from ce_retrieval.search.arrays import as_embeddings
from ce_retrieval.search.exact import ExactSearch, exact_search

__all__ = ["ann_recall_loss", "hits_at_k", "recall_at_k", "recall_with_distractors"]


def _check_ks(ks) -> tuple[int, ...]:
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be a non-empty list of positive ranks, got {ks}")
    return ks


def hits_at_k(indices: np.ndarray, query_ids: np.ndarray, doc_ids: np.ndarray, ks) -> dict[int, np.ndarray]:
    """Per query, whether a relevant document is among the first K retrieved (``indices`` [N, >=K]; -1 = none).

    Indices at or beyond ``len(doc_ids)`` (e.g. appended distractors) are relevant to nothing.
    """
    indices = np.asarray(indices)
    valid = (indices >= 0) & (indices < len(doc_ids))
    retrieved_ids = doc_ids[np.where(valid, indices, 0)]
    relevant = valid & (retrieved_ids == query_ids[:, None])
    first = np.where(relevant.any(axis=1), relevant.argmax(axis=1), np.iinfo(np.int64).max)
    return {k: first < k for k in ks}


def _direction(indices, query_ids, doc_ids, ks) -> tuple[dict[int, float], int, int]:
    """Recall@K over the queries that have a relevant document, their count, and the count left out."""
    has_relevant = np.isin(query_ids, doc_ids)
    hits = hits_at_k(indices, query_ids, doc_ids, ks)
    counted = int(has_relevant.sum())
    if counted == 0:
        return {k: float("nan") for k in ks}, 0, len(query_ids)
    return {k: float(hits[k][has_relevant].mean()) for k in ks}, counted, int(len(query_ids) - counted)


def recall_at_k(
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    ks=(1, 5, 10),
    search_fn=None,
    block_elements: int | None = None,
) -> dict:
    """Recall@K text->image (``t2i``) and image->text (``i2t``) and their ``rsum``.

    Args:
      query_emb, doc_emb: ``[N, d]`` caption and ``[M, d]`` image embeddings.
      query_ids, doc_ids: ``[N]`` and ``[M]`` ids.
      ks: ranks K.
      search_fn: text->image search over ``doc_emb`` (``search_fn(query_emb, k) -> (indices, scores)``);
        default exact search. Image->text always uses exact search over the captions.
      block_elements: score-block size of the exact search (bounded memory).

    Returns ``{"t2i": {K: frac}, "i2t": {K: frac}, "rsum": float, "t2i_queries", "t2i_excluded",
    "i2t_queries", "i2t_excluded"}``.
    """
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    ks = _check_ks(ks)
    kwargs = {} if block_elements is None else {"block_elements": int(block_elements)}
    t2i_search = search_fn if search_fn is not None else ExactSearch(d, **kwargs)
    t2i_idx, _ = t2i_search(q, min(max(ks), len(d)))
    i2t_idx, _ = exact_search(d, q, min(max(ks), len(q)), **kwargs)
    t2i, t2i_n, t2i_out = _direction(t2i_idx, qids, dids, ks)
    i2t, i2t_n, i2t_out = _direction(i2t_idx, dids, qids, ks)
    return {
        "t2i": t2i,
        "i2t": i2t,
        "rsum": float(sum(t2i.values()) + sum(i2t.values())),
        "t2i_queries": t2i_n,
        "t2i_excluded": t2i_out,
        "i2t_queries": i2t_n,
        "i2t_excluded": i2t_out,
    }


def recall_with_distractors(
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    distractor_emb,
    ks=(1, 5, 10, 100),
    search_fn=None,
    block_elements: int | None = None,
) -> dict:
    """Text->image Recall@K over the gallery ``doc_emb`` followed by ``distractor_emb`` (relevant to nothing).

    ``search_fn``, if given, must search that same concatenated gallery (test images first).
    Returns ``{"t2i": {K: frac}, "t2i_queries", "t2i_excluded", "num_distractors", "gallery_size"}``.
    """
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    extra = as_embeddings(distractor_emb, "distractor_emb") if distractor_emb is not None else d[:0]
    if extra.shape[1] != d.shape[1]:
        raise ValueError(f"distractor_emb has dimension {extra.shape[1]} but doc_emb has dimension {d.shape[1]}")
    ks = _check_ks(ks)
    gallery_size = len(d) + len(extra)
    if search_fn is None:
        kwargs = {} if block_elements is None else {"block_elements": int(block_elements)}
        search_fn = ExactSearch(np.concatenate([d, extra]), **kwargs)
    idx, _ = search_fn(q, min(max(ks), gallery_size))
    t2i, n_in, n_out = _direction(idx, qids, dids, ks)
    return {
        "t2i": t2i,
        "t2i_queries": n_in,
        "t2i_excluded": n_out,
        "num_distractors": len(extra),
        "gallery_size": gallery_size,
    }


def ann_recall_loss(query_emb, doc_emb, query_ids, doc_ids, search_fn, ks=(1, 5, 10, 100)) -> dict:
    """How much text->image recall an approximate ``search_fn`` (over ``doc_emb``) loses against exact search.

    Returns ``{"exact": {K: R@K}, "ann": {K: R@K}, "loss": {K: exact - ann}, "neighbour_recall": {K: share of the
    exact top-K documents that the approximate top-K also returns}}`` (the last is the ANN literature's recall).
    """
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    ks = _check_ks(ks)
    kmax = min(max(ks), len(d))
    exact_idx, _ = exact_search(q, d, kmax)
    ann_idx, _ = search_fn(q, kmax)
    ann_idx = np.asarray(ann_idx, dtype=np.int64)
    if ann_idx.ndim != 2 or len(ann_idx) != len(q):
        raise ValueError(f"search_fn returned indices of shape {ann_idx.shape}, expected [{len(q)}, {kmax}]")
    exact, _, _ = _direction(exact_idx, qids, dids, ks)
    ann, _, _ = _direction(ann_idx, qids, dids, ks)
    overlap = {}
    for k in ks:
        kk = min(k, kmax)
        found = 0
        for r0 in range(0, len(q), 1024):  # bounded memory: [1024, K, K] comparisons at a time
            e, a = exact_idx[r0 : r0 + 1024, :kk], ann_idx[r0 : r0 + 1024, :kk]
            found += int((e[:, :, None] == a[:, None, :]).any(axis=2).sum())
        overlap[k] = found / (len(q) * kk)
    return {"exact": exact, "ann": ann, "loss": {k: exact[k] - ann[k] for k in ks}, "neighbour_recall": overlap}
