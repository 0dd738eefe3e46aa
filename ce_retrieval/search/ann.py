"""Approximate search with ScaNN: the one ScaNN set-up of the project, and a drop-in ``search_fn``.

:func:`build_scann` builds the ScaNN searcher both the evaluation (``ScannSearch``) and the serving index
(``ce_retrieval.build.index.build_index``) use, for maximum inner product search (the towers' embeddings are
L2-normalised, so this is cosine similarity): a spherical k-means tree partitions the gallery (``num_leaves``
~ sqrt(M)), anisotropic product quantisation (2 dims/block, threshold 0.2) scores candidates and the best
``reorder`` candidates are rescored exactly. :func:`default_params` fills the parameters left open from the
gallery size. ``ScannSearch(doc_emb)`` wraps it as a search function (``brute_force=True``: ScaNN's exact
mode); ``ann_recall_loss(q, d, qi, di, ScannSearch(d))`` then reports what the index costs in Recall@K.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from scann.scann_ops.py import scann_ops_pybind

from ce_retrieval.search.arrays import as_embeddings

__all__ = ["IndexParams", "ScannSearch", "build_scann", "default_params"]


@dataclasses.dataclass
class IndexParams:
    """ScaNN parameters; ``None`` fields are chosen from the gallery size by :func:`default_params`."""

    num_leaves: int | None = None
    leaves_to_search: int | None = None  # None: num_leaves // 10 (the serving index tunes it for a target recall)
    training_sample_size: int | None = None
    spherical_tree: bool = True  # spherical k-means leaves suit unit vectors (measured: higher recall per leaf)
    dims_per_block: int = 2
    anisotropic_quantization_threshold: float = 0.2
    reorder_num_neighbors: int | None = None


def default_params(n: int, params: IndexParams | None = None, num_neighbors: int = 10) -> IndexParams:
    """A copy of ``params`` with the open fields set for a gallery of ``n`` items searched for ``num_neighbors``:
    ``num_leaves = max(1, min(n // 8, round(sqrt n)))``, ``training_sample_size = min(n, 250,000)`` and
    ``reorder_num_neighbors = max(num_neighbors, 100 if n < 500,000 else 200)`` (exact re-ranking of at least
    as many candidates as results asked for, deeper on large galleries). ``leaves_to_search`` stays open."""
    p = dataclasses.replace(params or IndexParams())
    if p.num_leaves is None:
        p.num_leaves = max(1, min(n // 8, round(math.sqrt(n))))
    if p.training_sample_size is None:
        p.training_sample_size = min(n, 250_000)
    if p.reorder_num_neighbors is None:
        p.reorder_num_neighbors = max(int(num_neighbors), 100 if n < 500_000 else 200)
    return p


def scann_builder(x: np.ndarray, p: IndexParams, num_neighbors: int = 10, brute_force: bool = False):
    """The (unbuilt) ScaNN builder of :func:`build_scann`; ``p`` as returned by :func:`default_params`."""
    from scann.scann_ops.py import scann_ops_pybind  # heavy import (pulls in TensorFlow ops), only when needed

    builder = scann_ops_pybind.builder(x, num_neighbors, "dot_product")
    if brute_force:
        return builder.score_brute_force()
    return (
        builder.tree(
            num_leaves=p.num_leaves,
            num_leaves_to_search=p.leaves_to_search or max(1, p.num_leaves // 10),
            training_sample_size=p.training_sample_size,
            spherical=p.spherical_tree,
        )
        .score_ah(p.dims_per_block, anisotropic_quantization_threshold=p.anisotropic_quantization_threshold)
        .reorder(p.reorder_num_neighbors)
    )


def build_scann(
    x: np.ndarray, p: IndexParams, num_neighbors: int = 10, brute_force: bool = False
) -> scann_ops_pybind.ScannSearcher:
    """A ScaNN searcher over the rows of ``x`` (float32 [n, d]) returning ``num_neighbors`` by default:
    tree + asymmetric hashing + exact re-ranking with the parameters ``p``, or exact scoring (``brute_force``)."""
    return scann_builder(x, p, num_neighbors, brute_force).build()


class ScannSearch:
    """``ScannSearch(doc_emb)(query_emb, k) -> (indices [N, k] int64, scores [N, k] float32)``; -1 = no result.

    Parameters left None follow :func:`default_params` with ``num_neighbors = max_k``; galleries of fewer than 64
    items are scored exactly."""

    def __init__(
        self,
        doc_emb,
        max_k: int = 100,
        num_leaves: int | None = None,
        num_leaves_to_search: int | None = None,
        reorder: int | None = None,
        brute_force: bool = False,
        training_sample_size: int = 250_000,
    ):
        self.doc_emb = as_embeddings(doc_emb, "doc_emb")
        m = len(self.doc_emb)
        self.max_k = int(max_k)
        given = IndexParams(
            num_leaves=num_leaves or None,
            leaves_to_search=num_leaves_to_search or None,
            training_sample_size=min(m, int(training_sample_size)),
            reorder_num_neighbors=reorder or None,
        )
        self.params = default_params(m, given, num_neighbors=self.max_k)
        self.searcher = build_scann(self.doc_emb, self.params, min(self.max_k, m), brute_force=brute_force or m < 64)

    def __len__(self) -> int:
        return len(self.doc_emb)

    def __call__(self, query_emb, k: int):
        q = as_embeddings(query_emb, "query_emb")
        k = min(int(k), len(self.doc_emb))
        neighbors, distances = self.searcher.search_batched(q, final_num_neighbors=k)
        indices = np.full((len(q), k), -1, np.int64)
        scores = np.full((len(q), k), -np.inf, np.float32)
        got = min(k, neighbors.shape[1]) if neighbors.ndim == 2 else 0
        indices[:, :got] = neighbors[:, :got]
        scores[:, :got] = distances[:, :got]
        return indices, scores
