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

Cost: ``sum_n exp(c (S_an + S_pn))`` (``c = 4 tan^2 alpha``) is needed only at the positive pairs (a, p).
When no row has more than ``positive_slots`` positives (P x K batches: K - 1), it is taken one positive
slot at a time: ``sum_n 1[Neg] exp(v_an + v_pn)`` with ``v = c (S - rowmax S)``, row ``p`` of ``v`` gathered
for every anchor (O(K N^2) time, O(N^2) memory; ``_pairs.over_positive_slots``, which carries its own
gradient: no second derivatives). Otherwise (or ``positive_slots=0``) every entry comes from one matrix
product ``A B^T``, ``A = 1[Neg] exp(c (S - max_neg))``, ``B = exp(c (S - max))`` (O(N^3) flops, O(N^2)
memory). No [N, N, N] tensor either way. The shifts keep every factor <= 1; with ``alpha <= 60`` degrees
(``c <= 12``) and ``|S| <= 1`` no term underflows in float32, hence the bound on ``alpha``.
Matches pytorch-metric-learning's ``AngularLoss(alpha)`` (mean over positive pairs).
"""
from __future__ import annotations

import math

import tensorflow as tf

from ce_retrieval.losses._pairs import (
    masked_logsumexp,
    masked_max,
    over_positive_slots,
    pair_masks,
    require_square,
)
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.registry import register


@register
class AngularLoss(RetrievalLoss):
    """Wang et al. (2017) angular loss on a square ``S = E E^T``; see module docstring."""

    supports_bidirectional = False

    def __init__(
        self, alpha: float = 40.0, with_npair: bool = False, npair_weight: float = 2.0, positive_slots: int = 8, **kwargs
    ):
        if not 0.0 < alpha <= 60.0:
            raise ValueError(f"AngularLoss: alpha is an angle in degrees in (0, 60], got {alpha}")
        if positive_slots < 0:
            raise ValueError(f"AngularLoss: positive_slots must be >= 0, got {positive_slots}")
        super().__init__(**kwargs)
        self.positive_slots = int(positive_slots)
        self.alpha = float(alpha)
        self.with_npair = bool(with_npair)
        self.npair_weight = float(npair_weight)

    @tf.autograph.experimental.do_not_convert  # no tensor-dependent Python control flow: skip autograph
    def compute(self, relevance, scores):
        scores = require_square(scores, "AngularLoss")
        positive, negative = pair_masks(relevance)
        tan2 = math.tan(math.radians(self.alpha)) ** 2
        c_neg, c_pos = 4.0 * tan2, 2.0 * (1.0 + tan2)
        with_npair = self.with_npair

        def npair_sum(lse, s_ap, mask):  # N-pair term: log(1 + sum_{Neg(a)} e^{S_an - S_ap}) = softplus(lse_a - S_ap)
            if not with_npair:
                return 0.0
            return tf.reduce_sum(tf.where(mask, tf.nn.softplus(lse - s_ap), tf.zeros_like(s_ap)))

        def row_lse(s):  # log sum_{n in Neg(a)} e^{S_an} ([N, 1]; NEG for a row without negatives)
            return masked_logsumexp(s, negative, axis=1)[:, None] if with_npair else None

        def dense(s):  # every [a, p] at once: one O(N^3) matrix product A B^T (any S: the shifts are exact)
            shift_a = tf.stop_gradient(tf.maximum(masked_max(s, negative), -1.0))  # [N, 1]
            shift_p = tf.stop_gradient(tf.reduce_max(s, axis=1, keepdims=True))
            a = tf.where(negative, tf.exp(c_neg * (s - shift_a)), tf.zeros_like(s))
            b = tf.exp(c_neg * (s - shift_p))
            pair_sum = tf.matmul(a, b, transpose_b=True)
            has = pair_sum > 0.0
            log_sum = tf.math.log(tf.where(has, pair_sum, tf.ones_like(pair_sum))) + c_neg * (
                shift_a + tf.transpose(shift_p)
            )
            per_pair = tf.where(has & positive, tf.nn.softplus(log_sum - c_pos * s), tf.zeros_like(s))
            return weight * tf.reduce_sum(per_pair) + npair_sum(row_lse(s), s, positive), ()

        def make_slot(s):
            # A[a, n] B[p, n] = exp(v_an + v_pn) on the negatives, v = c (S - rowmax S) computed once per batch.
            # The row max bounds every factor by 1; on the unit sphere (|S| <= 1) v >= -2c >= -24, so nothing
            # underflows in float32.
            shift = tf.stop_gradient(tf.reduce_max(s, axis=1, keepdims=True))
            v = c_neg * (s - shift)
            lse = row_lse(s)

            def slot(columns, valid):  # one positive p per anchor a: sum_n A[a, n] B[p, n] in one O(N M) pass
                terms = tf.where(negative, tf.exp(v + tf.gather(v, columns)), tf.zeros_like(v))
                pair_sum = tf.reduce_sum(terms, axis=1, keepdims=True)
                has = pair_sum > 0.0
                log_sum = tf.math.log(tf.where(has, pair_sum, tf.ones_like(pair_sum))) + c_neg * (
                    shift + tf.gather(shift, columns)
                )
                s_ap = tf.gather(s, columns[:, None], batch_dims=1)
                mask = valid[:, None]
                per_pair = tf.where(has & mask, tf.nn.softplus(log_sum - c_pos * s_ap), tf.zeros_like(s_ap))
                return weight * tf.reduce_sum(per_pair) + npair_sum(lse, s_ap, mask), ()

            return slot

        weight = self.npair_weight if with_npair else 1.0  # l_npair + lambda * l_ang, or l_ang alone
        total, _ = over_positive_slots(scores, positive, self.positive_slots, make_slot, dense)
        return total / tf.maximum(tf.reduce_sum(tf.cast(positive, tf.float32)), 1.0)  # mean over positive pairs

    def get_config(self):
        config = super().get_config()
        config.update(
            alpha=self.alpha,
            with_npair=self.with_npair,
            npair_weight=self.npair_weight,
            positive_slots=self.positive_slots,
        )
        return config


__all__ = ["AngularLoss"]
