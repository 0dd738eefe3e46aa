"""Relevance matrices from ids: ``R[i, j] = 1`` if query i and document j share an id, else 0.

With ``exclude_self=True`` (single-modality metric learning, ``S = E E^T``) the diagonal is set to -1
(ignored): an example is not its own positive. Two captions of one image share its id, so in a
caption x caption matrix they are positives of each other, never negatives.
"""

from __future__ import annotations

import tensorflow as tf

#: The three values of a relevance matrix: a positive pair, a negative pair, a pair that no loss looks at.
RELEVANT, IRRELEVANT, IGNORED = 1.0, 0.0, -1.0


def relevance_from_ids(query_ids, doc_ids, exclude_self: bool = False, dtype=tf.float32) -> tf.Tensor:
    """``[N, M]`` relevance in {-1, 0, 1} from ``query_ids [N]`` and ``doc_ids [M]`` (ints or strings)."""
    query_ids = tf.convert_to_tensor(query_ids)
    doc_ids = tf.convert_to_tensor(doc_ids)
    if query_ids.shape.rank != 1 or doc_ids.shape.rank != 1:
        raise ValueError(
            f"relevance_from_ids: ids must be rank-1 vectors, got shapes {query_ids.shape} and {doc_ids.shape}"
        )
    if query_ids.dtype != doc_ids.dtype:
        raise ValueError(f"relevance_from_ids: id dtypes differ ({query_ids.dtype.name} vs {doc_ids.dtype.name})")
    same = tf.equal(query_ids[:, None], doc_ids[None, :])
    relevance = tf.cast(same, dtype)
    if exclude_self:
        n, m = tf.shape(relevance)[0], tf.shape(relevance)[1]
        tf.debugging.assert_equal(n, m, message="relevance_from_ids: exclude_self needs a square matrix (N == M)")
        relevance = tf.linalg.set_diag(relevance, -tf.ones([tf.minimum(n, m)], dtype))
    return relevance


__all__ = ["IGNORED", "IRRELEVANT", "RELEVANT", "relevance_from_ids"]
