"""Approximate search with ScaNN as a drop-in ``search_fn`` for the recall metrics.

``ScannSearch(doc_emb)`` builds a ScaNN searcher over the gallery for maximum inner product search (the
towers' embeddings are L2-normalised, so this is cosine similarity): a k-means tree partitions the gallery
(``num_leaves`` ~ sqrt(M)), anisotropic product quantisation scores candidates and the best ``reorder``
candidates are rescored exactly. Use ``brute_force=True`` for ScaNN's exact mode.
``ann_recall_loss(q, d, qi, di, ScannSearch(d))`` then reports what the index costs in Recall@K.
"""
from __future__ import annotations

import numpy as np

from ce_retrieval.evaluation._arrays import as_embeddings

__all__ = ["ScannSearch"]


class ScannSearch:
    """``ScannSearch(doc_emb)(query_emb, k) -> (indices [N, k] int64, scores [N, k] float32)``; -1 = no result."""

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
        import scann  # heavy import (pulls in TensorFlow ops), only when an ANN index is wanted

        self.doc_emb = as_embeddings(doc_emb, "doc_emb")
        m = len(self.doc_emb)
        self.max_k = int(max_k)
        builder = scann.scann_ops_pybind.builder(self.doc_emb, min(self.max_k, m), "dot_product")
        if brute_force or m < 64:
            builder = builder.score_brute_force()
        else:
            leaves = int(num_leaves or max(2, min(m // 8, round(np.sqrt(m)))))
            to_search = int(num_leaves_to_search or max(1, leaves // 10))
            builder = (
                builder.tree(num_leaves=leaves, num_leaves_to_search=to_search, training_sample_size=min(m, int(training_sample_size)))
                .score_ah(2, anisotropic_quantization_threshold=0.2)
                .reorder(int(reorder or max(self.max_k, 100)))
            )
        self.searcher = builder.build()

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
