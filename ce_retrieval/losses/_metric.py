"""Shared numerics of the metric-learning losses: distances from a similarity matrix, masked log-sum-exp.

Distance-based objectives (NCA, ProxyNCA, LMNN, the centroid bound) are written in squared Euclidean
distances ``d²``; the loss contract hands them a similarity matrix ``S``. ``similarity`` says how to read it:

* ``'cosine'``: ``S`` holds cosines of unit vectors, so ``d² = ‖x − y‖² = 2 − 2S`` (ProbML 16.2.2);
* ``'negative_squared_distance'``: ``S = −d²`` already, e.g. the output of
  :class:`ce_retrieval.modeling.mahalanobis.PairwiseNegativeSquaredDistance` (a learned Mahalanobis metric).
"""
from __future__ import annotations

import tensorflow as tf

SIMILARITIES = ("cosine", "negative_squared_distance")
_NEG = -1e30  # stands in for -inf inside masked reductions (keeps gradients finite)


def check_similarity(similarity: str, owner: str) -> str:
    if similarity not in SIMILARITIES:
        raise ValueError(f"{owner}: similarity must be one of {SIMILARITIES}, got {similarity!r}")
    return similarity


def squared_distance(scores: tf.Tensor, similarity: str) -> tf.Tensor:
    """``d²`` (clamped at 0 against rounding) from a similarity matrix read as ``similarity``."""
    if similarity == "cosine":
        return tf.maximum(2.0 - 2.0 * scores, 0.0)
    return tf.maximum(-scores, 0.0)


def masked_logsumexp(logits: tf.Tensor, mask: tf.Tensor, axis: int = -1):
    """``(log Σ_{mask} e^{logits}, any(mask))`` along ``axis``; empty sets give 0 (check the flag).

    Masked entries never reach ``exp`` and empty sets never reach ``log``, so gradients stay finite.
    """
    mask = tf.cast(mask, tf.bool)
    x = tf.where(mask, logits, _NEG)
    peak = tf.stop_gradient(tf.reduce_max(x, axis=axis, keepdims=True))
    peak = tf.where(peak > 0.5 * _NEG, peak, 0.0)
    total = tf.reduce_sum(tf.where(mask, tf.exp(x - peak), 0.0), axis=axis)
    present = tf.reduce_any(mask, axis=axis)
    safe = tf.where(present, total, 1.0)
    return tf.math.log(safe) + tf.squeeze(peak, axis), present


def log1p_sum_exp(logits: tf.Tensor, mask: tf.Tensor, axis: int = -1) -> tf.Tensor:
    """``log(1 + Σ_{mask} e^{logits})`` along ``axis``, stable for large logits (0 for an empty set)."""
    mask = tf.cast(mask, tf.bool)
    x = tf.where(mask, logits, _NEG)
    peak = tf.stop_gradient(tf.maximum(tf.reduce_max(x, axis=axis, keepdims=True), 0.0))
    total = tf.exp(-peak) + tf.reduce_sum(tf.where(mask, tf.exp(x - peak), 0.0), axis=axis, keepdims=True)
    return tf.squeeze(tf.math.log(total) + peak, axis)


def masked_mean(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """Mean of ``values`` where ``mask`` (0 when nothing is selected)."""
    mask = tf.cast(mask, tf.bool)
    count = tf.reduce_sum(tf.cast(mask, tf.float32))
    return tf.reduce_sum(tf.where(mask, values, 0.0)) / tf.maximum(count, 1.0)
