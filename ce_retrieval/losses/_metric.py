"""Distances from a similarity matrix for the metric-learning losses (masked reductions: ``_pairs``).

Distance-based objectives (NCA, ProxyNCA, LMNN, the centroid bound) are written in squared Euclidean
distances ``d²``; the loss contract hands them a similarity matrix ``S``. ``similarity`` says how to read it:

* ``'cosine'``: ``S`` holds cosines of unit vectors, so ``d² = ‖x − y‖² = 2 − 2S`` (ProbML 16.2.2);
* ``'negative_squared_distance'``: ``S = −d²`` already, e.g. the output of
  :class:`ce_retrieval.modeling.mahalanobis.PairwiseNegativeSquaredDistance` (a learned Mahalanobis metric).
"""
from __future__ import annotations

import tensorflow as tf

SIMILARITIES = ("cosine", "negative_squared_distance")


def check_similarity(similarity: str, owner: str) -> str:
    if similarity not in SIMILARITIES:
        raise ValueError(f"{owner}: similarity must be one of {SIMILARITIES}, got {similarity!r}")
    return similarity


def squared_distance(scores: tf.Tensor, similarity: str) -> tf.Tensor:
    """``d²`` (clamped at 0 against rounding) from a similarity matrix read as ``similarity``."""
    if similarity == "cosine":
        return tf.maximum(2.0 - 2.0 * scores, 0.0)
    return tf.maximum(-scores, 0.0)
