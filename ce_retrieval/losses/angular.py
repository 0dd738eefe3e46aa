"""Angular loss (Wang, Zhou, Wen, Liu & Lin 2017, "Deep metric learning with angular loss"), N-pair form.

For a positive pair (a, p) and the negatives n of a (embeddings L2-normalised, ``S = E E^T``):

    f_apn   = 4 tan^2(alpha) (x_a + x_p)^T x_n - 2 (1 + tan^2(alpha)) x_a^T x_p
            = 4 tan^2(alpha) (S_an + S_pn) - 2 (1 + tan^2(alpha)) S_ap
    l_ang   = mean over positive pairs of log(1 + sum_{n in Neg(a)} exp(f_apn))
    l_total = l_npair + lambda * l_ang        (with_npair=True; paper: lambda = 2)

``alpha`` is given in degrees (default 40, pytorch-metric-learning's; the paper uses 36-55). ``l_npair`` is
``NPairLoss`` on the same ``S`` (scale 1). ``x_p^T x_n`` needs the similarity of the positive to the
negative, so ``S`` must be square (queries and documents are the same items, ``S = E E^T``); the
two-tower text x image matrix lacks image-image similarities and is refused with a clear error.

Cost: ``sum_n exp(c (S_an + S_pn))`` for all (a, p) is a matrix product ``A B^T`` with
``A = 1[Neg] * exp(c (S - max_neg))`` and ``B = exp(c (S - max))`` (O(N^3) flops on the matmul unit,
O(N^2) memory; no [N, N, N] tensor). The shifts keep every factor <= 1; with ``alpha <= 60`` degrees
(``c = 4 tan^2 alpha <= 12``) no term underflows in float32, hence the bound on ``alpha``.
Matches pytorch-metric-learning's ``AngularLoss(alpha)`` (mean over positive pairs).
"""
from __future__ import annotations

import math

import tensorflow as tf

from ce_retrieval.losses._pairs import masked_max, masked_mean, pair_masks, require_square
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.npair import softmax_per_positive
from ce_retrieval.losses.registry import register


@register
class AngularLoss(RetrievalLoss):
    """Wang et al. (2017) angular loss on a square ``S = E E^T``; see module docstring."""

    supports_bidirectional = False

    def __init__(self, alpha: float = 40.0, with_npair: bool = False, npair_weight: float = 2.0, **kwargs):
        if not 0.0 < alpha <= 60.0:
            raise ValueError(f"AngularLoss: alpha is an angle in degrees in (0, 60], got {alpha}")
        super().__init__(**kwargs)
        self.alpha = float(alpha)
        self.with_npair = bool(with_npair)
        self.npair_weight = float(npair_weight)

    @tf.autograph.experimental.do_not_convert  # no tensor-dependent Python control flow: skip autograph
    def compute(self, relevance, scores):
        scores = require_square(scores, "AngularLoss")
        positive, negative = pair_masks(relevance)
        tan2 = math.tan(math.radians(self.alpha)) ** 2
        c_neg, c_pos = 4.0 * tan2, 2.0 * (1.0 + tan2)
        shift_a = tf.stop_gradient(tf.maximum(masked_max(scores, negative), -1.0))  # [N, 1]
        shift_p = tf.stop_gradient(tf.reduce_max(scores, axis=1, keepdims=True))
        a = tf.where(negative, tf.exp(c_neg * (scores - shift_a)), tf.zeros_like(scores))
        b = tf.exp(c_neg * (scores - shift_p))
        pair_sum = tf.matmul(a, b, transpose_b=True)  # [a, p] = sum_n A[a, n] B[p, n]
        has = pair_sum > 0.0
        log_sum = tf.math.log(tf.where(has, pair_sum, tf.ones_like(pair_sum)))
        log_sum = log_sum + c_neg * (shift_a + tf.transpose(shift_p))
        per_pair = tf.where(has, tf.nn.softplus(log_sum - c_pos * scores), tf.zeros_like(scores))
        value = self.npair_weight * masked_mean(per_pair, positive) if self.with_npair else masked_mean(per_pair, positive)
        if self.with_npair:
            value = value + softmax_per_positive(relevance, scores)
        return value

    def get_config(self):
        config = super().get_config()
        config.update(alpha=self.alpha, with_npair=self.with_npair, npair_weight=self.npair_weight)
        return config


__all__ = ["AngularLoss"]
