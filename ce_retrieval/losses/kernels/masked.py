"""Masked reductions over a similarity matrix ``S [N, M]`` and a relevance matrix ``R`` in {-1, 0, 1}.

Every loss reduces with these, and with one mean: :func:`masked_mean` (``mean_over_positives`` is that mean
over the positive pairs, the loss contract's default reduction). Distances from ``S`` are in ``losses/_similarity.py``;
the speed paths (positive slots, sorted merges, radix selection) in ``fast_paths``.

The reductions are written for XLA (no boolean indexing, no ragged shapes): masked entries are replaced by
neutral values with ``tf.where`` *before* any non-linear op, so neither the value nor the gradient sees them
(no ``inf * 0`` NaNs).
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.relevance import IRRELEVANT, RELEVANT

#: Stand-in for -inf in masked log-sum-exp: finite, so ``softplus(NEG) == 0`` with a zero gradient.
NEG = -1e9


def pair_masks(relevance: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Boolean ``(positive, negative)`` masks; ignored pairs (-1) are in neither."""
    return tf.equal(relevance, RELEVANT), tf.equal(relevance, IRRELEVANT)


def masked_mean(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """Mean of ``values`` over ``mask`` (0 when the mask is empty); masked-out entries may be anything finite."""
    mask = tf.cast(mask, tf.bool)
    total = tf.reduce_sum(tf.where(mask, values, tf.zeros_like(values)))
    return total / tf.maximum(tf.reduce_sum(tf.cast(mask, values.dtype)), 1.0)


def mean_over_positives(per_pair: tf.Tensor, relevance: tf.Tensor) -> tf.Tensor:
    """Mean of ``per_pair[i, j]`` over positive pairs (relevance == 1): :func:`masked_mean` on the positives."""
    return masked_mean(per_pair, tf.equal(relevance, RELEVANT))


def masked_logsumexp(x: tf.Tensor, mask: tf.Tensor, axis: int = -1, add_one: bool = False) -> tf.Tensor:
    """``log(sum_{mask} exp(x))`` along ``axis`` (``log(1 + sum ...)`` with ``add_one``), numerically stable.

    Rows with an empty mask give ``NEG`` (or 0 with ``add_one``), with zero gradient.
    """
    mask = tf.cast(mask, tf.bool)
    filled = tf.where(mask, x, NEG * tf.ones_like(x))
    shift = tf.stop_gradient(tf.reduce_max(filled, axis=axis, keepdims=True))
    if add_one:  # the implicit 0 logit joins the max
        shift = tf.maximum(shift, 0.0)
    exp = tf.where(mask, tf.exp(filled - shift), tf.zeros_like(x))
    total = tf.reduce_sum(exp, axis=axis, keepdims=True)
    if add_one:
        total = total + tf.exp(-shift)
        return tf.squeeze(shift + tf.math.log(total), axis=axis)
    nonempty = total > 0.0
    safe = tf.where(nonempty, total, tf.ones_like(total))
    out = tf.where(nonempty, shift + tf.math.log(safe), NEG * tf.ones_like(total))
    return tf.squeeze(out, axis=axis)


def logaddexp(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``log(exp(a) + exp(b))`` elementwise with broadcasting, stable for large or ``NEG`` inputs."""
    top = tf.stop_gradient(tf.maximum(a, b))
    return top + tf.math.log(tf.exp(a - top) + tf.exp(b - top))


def masked_max(x: tf.Tensor, mask: tf.Tensor, axis: int = -1, keepdims: bool = True) -> tf.Tensor:
    """Max over ``mask`` (``NEG`` where the mask is empty); gradient flows to the arg-max entry only."""
    return tf.reduce_max(tf.where(tf.cast(mask, tf.bool), x, NEG * tf.ones_like(x)), axis=axis, keepdims=keepdims)


def masked_min(x: tf.Tensor, mask: tf.Tensor, axis: int = -1, keepdims: bool = True) -> tf.Tensor:
    """Min over ``mask`` (``-NEG`` where the mask is empty)."""
    return tf.reduce_min(tf.where(tf.cast(mask, tf.bool), x, -NEG * tf.ones_like(x)), axis=axis, keepdims=keepdims)


def row_any(mask: tf.Tensor, keepdims: bool = True) -> tf.Tensor:
    return tf.reduce_any(tf.cast(mask, tf.bool), axis=-1, keepdims=keepdims)
