"""Circle loss (Sun et al. 2020, "Circle loss: a unified perspective of pair similarity optimization"),
pair-wise-label form on cosine similarities.

For anchor i with positive similarities s_p and negative similarities s_n,

    alpha_p = [1 + m - s_p]_+,   alpha_n = [s_n + m]_+        (self-paced weights, no gradient)
    Delta_p = 1 - m,             Delta_n = m
    L_i = log(1 + sum_n exp(gamma alpha_n (s_n - Delta_n)) * sum_p exp(-gamma alpha_p (s_p - Delta_p)))
        = softplus( LSE_n(gamma alpha_n (s_n - Delta_n)) + LSE_p(-gamma alpha_p (s_p - Delta_p)) )

Defaults m = 0.25, gamma = 256 (the paper's face-recognition setting); the paper uses m = 0.4, gamma = 80
for fine-grained image retrieval (pytorch-metric-learning's defaults). The alphas are detached, as in the
reference implementation. Reduction: mean over anchors having at least one positive and one negative
(pytorch-metric-learning zeroes other rows; its ``AvgNonZeroReducer`` then averages non-zero rows, the same
unless a row's loss underflows to exactly 0).

Anchor ``i``'s terms are all in row ``i`` (``needs_gram`` is false). Functional core: :func:`circle`.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import masked_logsumexp, masked_mean, pair_masks, row_any
from ce_retrieval.losses.registry import register


def _check(margin, gamma, owner: str):
    if gamma <= 0:
        raise ValueError(f"{owner}: gamma must be > 0, got {gamma}")
    return float(margin), float(gamma)


def circle(relevance, scores, margin: float = 0.25, gamma: float = 256.0):
    """Sun et al. (2020), mean over anchors with a positive and a negative (module docstring)."""
    m, gamma = _check(margin, gamma, "circle")
    positive, negative = pair_masks(relevance)
    alpha_p = tf.stop_gradient(tf.nn.relu(1.0 + m - scores))
    alpha_n = tf.stop_gradient(tf.nn.relu(scores + m))
    lse_p = masked_logsumexp(-gamma * alpha_p * (scores - (1.0 - m)), positive)
    lse_n = masked_logsumexp(gamma * alpha_n * (scores - m), negative)
    anchors = row_any(positive, keepdims=False) & row_any(negative, keepdims=False)
    per_anchor = tf.where(anchors, tf.nn.softplus(lse_p + lse_n), tf.zeros_like(lse_p))
    return masked_mean(per_anchor, anchors)


@register
class CircleLoss(RetrievalLoss):
    """Sun et al. (2020) with relaxation ``m`` and scale ``gamma``; see module docstring."""

    function = circle
    check = staticmethod(_check)


__all__ = ["CircleLoss"]
