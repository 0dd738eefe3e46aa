"""Angular loss (Wang, Zhou, Wen, Liu & Lin 2017, "Deep metric learning with angular loss"), N-pair form.

For a positive pair (a, p) and the negatives n of a (embeddings L2-normalised, ``S = E E^T``):

    f_apn   = 4 tan^2(alpha) (x_a + x_p)^T x_n - 2 (1 + tan^2(alpha)) x_a^T x_p
            = 4 tan^2(alpha) (S_an + S_pn) - 2 (1 + tan^2(alpha)) S_ap
    l_ang   = mean over positive pairs of log(1 + sum_{n in Neg(a)} exp(f_apn))
    l_total = l_npair + lambda * l_ang        (with_npair=True; paper: lambda = 2)

``alpha`` is given in degrees (default 40, pytorch-metric-learning's; the paper uses 36-55). ``l_npair`` is
``NPairLoss`` on the same ``S`` (scale 1).

Gram matrix (``needs_gram = True``). ``x_p^T x_n = S_pn`` is the similarity of the positive ``p`` to the
negative ``n``, read from row ``p`` of ``S`` as if ``p`` were a query: ``S`` must be the Gram matrix
``S = E E^T`` of one embedding set. A two-tower text x image matrix is square too (``[B, B]``) but its row
``p`` is a text's similarities to images, not image ``p``'s to image ``n``, so it would be silently misread;
the loss refuses it: validation checks that ``S`` is square (statically where the shape is known), symmetric
within 1e-2 and has a unit diagonal (run-time asserts, compiled out under XLA), and names the problem. The
two-tower task passes the joint Gram matrix of ``[text; image]`` embeddings (self-pairs ignored) instead.

Cost: ``sum_n exp(c (S_an + S_pn))`` (``c = 4 tan^2 alpha``) is needed only at the positive pairs (a, p).
When no row has more than ``positive_slots`` positives (P x K batches: K - 1), it is taken one positive
slot at a time: ``sum_n 1[Neg] exp(v_an + v_pn)`` with ``v = c (S - rowmax S)``, row ``p`` of ``v`` gathered
for every anchor (O(K N^2) time, O(N^2) memory; ``fast_paths.over_positive_slots``, which carries its own
gradient, itself differentiable). Otherwise (or ``positive_slots=0``) every entry comes from one matrix
product ``A B^T``, ``A = 1[Neg] exp(c (S - max_neg))``, ``B = exp(c (S - max))`` (O(N^3) flops, O(N^2)
memory). No [N, N, N] tensor either way. The shifts keep every factor <= 1; with ``alpha <= 60`` degrees
(``c <= 12``) and ``|S| <= 1`` no term underflows in float32, hence the bound on ``alpha``.
Matches pytorch-metric-learning's ``AngularLoss(alpha)`` (mean over positive pairs).
Functional core: :func:`angular` (``ce_retrieval.losses.functional.angular``, which checks the Gram matrix too).
"""

from __future__ import annotations

import math

import tensorflow as tf

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.fast_paths import over_positive_slots
from ce_retrieval.losses.kernels.masked import masked_logsumexp, masked_max, pair_masks
from ce_retrieval.losses.registry import register


def check_angular(alpha, with_npair, npair_weight, positive_slots, owner: str = "AngularLoss") -> dict:
    if not 0.0 < alpha <= 60.0:
        raise ValueError(f"{owner}: alpha is an angle in degrees in (0, 60], got {alpha}")
    if positive_slots < 0:
        raise ValueError(f"{owner}: positive_slots must be >= 0, got {positive_slots}")
    return dict(
        alpha=float(alpha),
        with_npair=bool(with_npair),
        npair_weight=float(npair_weight),
        positive_slots=int(positive_slots),
    )


def angular(
    relevance, scores, alpha: float = 40.0, with_npair: bool = False, npair_weight: float = 2.0, positive_slots: int = 8
):
    """Angular loss (module docstring) on the Gram matrix ``S = E E^T`` (not checked here: the class and
    ``functional.angular`` validate it), mean over positive pairs."""
    options = check_angular(alpha, with_npair, npair_weight, positive_slots, owner="angular")
    positive, negative = pair_masks(relevance)
    tan2 = math.tan(math.radians(options["alpha"])) ** 2
    c_neg, c_pos = 4.0 * tan2, 2.0 * (1.0 + tan2)
    with_npair = options["with_npair"]

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

    weight = options["npair_weight"] if with_npair else 1.0  # l_npair + lambda * l_ang, or l_ang alone
    total, _ = over_positive_slots(scores, positive, options["positive_slots"], make_slot, dense)
    return total / tf.maximum(tf.reduce_sum(tf.cast(positive, tf.float32)), 1.0)  # mean over positive pairs


@register
class AngularLoss(RetrievalLoss):
    """Wang et al. (2017) angular loss on the Gram matrix ``S = E E^T`` (``needs_gram``); see module docstring."""

    function = angular
    check = staticmethod(check_angular)
    supports_bidirectional = False
    needs_gram = True


__all__ = ["AngularLoss"]
