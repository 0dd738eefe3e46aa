"""Exact merging of per-shard search answers into the answer over the whole gallery (pure NumPy, no I/O).

A sharded gallery is a disjoint union of shards. Because scores are absolute cosine similarities s(q, x) = q.x,
not per-shard ranks, the global answers follow from the shards' answers alone:

* top-k: every item of the global top-k is in its own shard's top-k, so the global top-k is the top-k of the
  union of the shards' top-k lists;
* threshold: the items with s >= tau are the union of each shard's items with s >= tau.

Both are ordered by score descending and, for equal scores, by gallery id ascending, so the merged order does not
depend on the number of shards or on the order in which shards answer. These functions are shared by the
in-process :class:`~ce_retrieval.search.sharded.ShardedIndex` and a remote router that collects the same
lists from shard servers.

Missing results: a shard may return fewer columns than asked for (``GalleryIndex.topk`` returns
``min(k, shard size)``), and a remote or approximate searcher may pad rows. A result is recognised as padding by
a non-finite score (NaN or -inf), never by its id, because -1, -2, ... are real gallery ids (distractors).
The merged top-k pads the same way (id ``PAD_ID``, score ``PAD_SCORE``) only where a row has fewer valid results
than others.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["PAD_ID", "PAD_SCORE", "merge_threshold", "merge_topk"]

PAD_ID = -1
PAD_SCORE = -np.inf


def _as_2d(values, dtype, batch: int | None, name: str) -> np.ndarray:
    a = np.asarray(values, dtype=dtype)
    if a.ndim == 1 and a.size == 0 and batch is not None:  # a shard that returned nothing at all
        a = a.reshape(batch, 0)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a [B, k_i] array, got shape {a.shape}")
    return a


def merge_topk(
    per_shard_ids: Sequence[np.ndarray], per_shard_scores: Sequence[np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` of the union of per-shard top-k lists.

    ``per_shard_ids[s]`` int [B, k_s] and ``per_shard_scores[s]`` float [B, k_s] (k_s may differ between shards,
    and be 0). Returns ``(ids int64 [B, k'], scores float32 [B, k'])`` ordered by score descending, then id
    ascending, with ``k' = min(k, most valid results of any row)``; rows with fewer valid results are padded with
    (``PAD_ID``, ``PAD_SCORE``).
    """
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if len(per_shard_ids) != len(per_shard_scores):
        raise ValueError(f"{len(per_shard_ids)} id arrays but {len(per_shard_scores)} score arrays")
    if not per_shard_ids:
        raise ValueError("no shard answers to merge")
    batch = next((np.shape(i)[0] for i in per_shard_ids if np.ndim(i) == 2), None)
    ids_list, scores_list = [], []
    for s, (i, v) in enumerate(zip(per_shard_ids, per_shard_scores, strict=True)):
        i = _as_2d(i, np.int64, batch, f"ids of shard {s}")
        v = _as_2d(v, np.float32, batch, f"scores of shard {s}")
        if i.shape != v.shape:
            raise ValueError(f"shard {s}: ids {i.shape} and scores {v.shape} differ in shape")
        if batch is None:
            batch = i.shape[0]
        if i.shape[0] != batch:
            raise ValueError(f"shard {s} answered {i.shape[0]} queries, shard 0 answered {batch}")
        ids_list.append(i)
        scores_list.append(v)
    ids = np.concatenate(ids_list, axis=1)
    scores = np.concatenate(scores_list, axis=1)
    valid = np.isfinite(scores)
    width = min(k, int(valid.sum(axis=1).max())) if batch else min(k, ids.shape[1])
    # lexsort: the last key is the primary one. Padding sorts last (+inf), then score descending, then id ascending.
    order = np.lexsort((ids, np.where(valid, -scores, np.inf)), axis=1)[:, :width]
    out_ids = np.take_along_axis(ids, order, axis=1)
    out_scores = np.take_along_axis(scores, order, axis=1)
    pad = ~np.take_along_axis(valid, order, axis=1)
    out_ids[pad], out_scores[pad] = PAD_ID, PAD_SCORE
    return out_ids, out_scores


def merge_threshold(
    per_shard_ids: Sequence[Sequence[np.ndarray]],
    per_shard_scores: Sequence[Sequence[np.ndarray]],
    limit: int | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The union of per-shard threshold answers.

    ``per_shard_ids[s][b]`` / ``per_shard_scores[s][b]``: shard s's ids and scores for query b (any order; padding
    with a non-finite score is dropped). Returns, per query, ``(ids int64 [m_b], scores float32 [m_b])`` ordered by
    score descending then id ascending, cut to the best ``limit`` when given (a caller that needs to know whether
    a cut happened compares ``limit`` with the sum of the shards' lengths).
    """
    if limit is not None and int(limit) < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if len(per_shard_ids) != len(per_shard_scores):
        raise ValueError(f"{len(per_shard_ids)} id lists but {len(per_shard_scores)} score lists")
    if not per_shard_ids:
        raise ValueError("no shard answers to merge")
    batch = len(per_shard_ids[0])
    for s, (i, v) in enumerate(zip(per_shard_ids, per_shard_scores, strict=True)):
        if len(i) != batch or len(v) != batch:
            raise ValueError(f"shard {s} answered {len(i)} / {len(v)} queries, shard 0 answered {batch}")
    out_ids, out_scores = [], []
    for b in range(batch):
        ids = np.concatenate([np.asarray(shard[b], dtype=np.int64).ravel() for shard in per_shard_ids])
        scores = np.concatenate([np.asarray(shard[b], dtype=np.float32).ravel() for shard in per_shard_scores])
        if ids.shape != scores.shape:
            raise ValueError(f"query {b}: {ids.size} ids but {scores.size} scores")
        keep = np.isfinite(scores)
        ids, scores = ids[keep], scores[keep]
        order = np.lexsort((ids, -scores))
        if limit is not None:
            order = order[: int(limit)]
        out_ids.append(ids[order])
        out_scores.append(scores[order])
    return out_ids, out_scores
