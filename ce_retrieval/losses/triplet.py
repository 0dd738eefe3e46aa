"""Triplet margin loss (Schroff et al. 2015, FaceNet) with all / hard / semi-hard mining and VSE++'s form.

For an anchor ``a`` (a row of ``S``), a positive ``p`` and a negative ``n`` of that row,

    l(a, p, n) = [ m + D(a, p) - D(a, n) ]_+

with ``D`` chosen by ``distance``: ``'squared_euclidean'`` (FaceNet: ``D = ||x_a - x||^2 = 2 - 2s``, margin
alpha = 0.2, the default), ``'euclidean'`` (pytorch-metric-learning's ``TripletMarginLoss``) or ``'cosine'``
(``D = 1 - s``: then ``l = [m - s_ap + s_an]_+``, the hinge of VSE++ (Faghri et al. 2018) and of
TF-Similarity's ``TripletLoss(distance='cosine')``).

Which triplets (``mining``, per positive pair (a, p)):

* ``'all'``: every negative of the row. Reduction: mean over positive pairs of the mean over the row's
  negatives (= the mean over all valid triplets when every row has as many negatives, e.g. P x K batches);
  ``average_nonzero=True`` divides the sum by the number of *active* triplets (loss > 0) instead, as the
  batch-all loss of Hermans et al. (2017) and pytorch-metric-learning's default ``AvgNonZeroReducer``.
  Cost: no ``[N, M, M]`` tensor. When no row has more than ``positive_slots`` positives (P x K batches:
  K - 1; image-text batches: the captions of an image), the hinge sums are taken one positive slot at a
  time (``fast_paths.over_positive_slots``): O(K N M) time, O(N M) memory. Otherwise
  ``sum_n [t - D_an]_+ = count(D_an < t) * t - sum_{D_an < t} D_an`` with ``t = m + D_ap``; both come from
  one sorted merge per row of the thresholds with the negative distances and running sums along it
  (``fast_paths.count_below``): O(N M log M) time, O(N M) memory (also under XLA). Both exact, value and
  gradient (second derivatives included).
* ``'hard'``: the hardest negative of the row, ``min_n D(a, n)`` — VSE++'s max violation
  (``max_violation=True`` is an alias). With ``bidirectional=True`` and ``distance='cosine'`` this is the
  VSE++ image-text loss (VSE++ sums over the batch; here it is averaged).
* ``'semi-hard'``: FaceNet's semi-hard negative, the closest negative farther than the positive (falling
  back to the farthest negative when none is), see ``miners.semi_hard_negative_indices``. Per positive
  slot (as for ``'all'``) it is a masked arg-max per row, O(K N M); beyond ``positive_slots`` positives in
  a row, the miner's one sort per row, O(N M log M). With ``positive_mining='hard'`` each row has one
  positive: a masked max/min, O(N M).

``positive_mining='hard'`` keeps only each anchor's farthest positive (one term per anchor): with
``mining='hard'`` it is the batch-hard loss of Hermans et al. and TF-Similarity's ``('hard', 'hard')``,
with ``'semi-hard'`` TF-Similarity's default ``('hard', 'semi-hard')``.
Reduction for 'hard' and 'semi-hard': mean over kept positive pairs whose row has a negative.

Every triplet lies in one row (anchor ``a``, positive and negative both documents of ``a``), so ``S`` need
not be a Gram matrix (``needs_gram`` is false): on a two-tower text × image matrix it is VSE++'s loss.
Functional core: :func:`triplet` (``ce_retrieval.losses.functional.triplet``).
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses import miners
from ce_retrieval.losses._similarity import check_distance
from ce_retrieval.losses._similarity import distance as distance_from_similarity
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.fast_paths import count_below, over_positive_slots
from ce_retrieval.losses.kernels.masked import masked_max, masked_mean, masked_min, pair_masks, row_any
from ce_retrieval.losses.registry import register

MINING = ("all", "hard", "semi-hard")
POSITIVE_MINING = ("all", "hard")


def check_triplet(
    margin,
    mining,
    distance,
    positive_mining,
    max_violation,
    average_nonzero,
    positive_slots,
    owner: str = "TripletLoss",
) -> dict:
    """The validated hyper-parameters (``max_violation=True`` is ``mining='hard'``); ``ValueError`` otherwise."""
    if mining not in MINING:
        raise ValueError(f"{owner}: mining must be one of {MINING}, got {mining!r}")
    if positive_mining not in POSITIVE_MINING:
        raise ValueError(f"{owner}: positive_mining must be one of {POSITIVE_MINING}, got {positive_mining!r}")
    if max_violation:
        if mining == "semi-hard":
            raise ValueError(f"{owner}: max_violation=True (hardest negative) contradicts mining='semi-hard'")
        mining = "hard"
    if average_nonzero and mining != "all":
        raise ValueError(f"{owner}: average_nonzero only applies to mining='all'")
    if margin < 0:
        raise ValueError(f"{owner}: margin must be >= 0, got {margin}")
    if positive_slots < 0:
        raise ValueError(f"{owner}: positive_slots must be >= 0, got {positive_slots}")
    return dict(
        margin=float(margin),
        mining=mining,
        distance=check_distance(distance, owner),
        positive_mining=positive_mining,
        max_violation=bool(max_violation),
        average_nonzero=bool(average_nonzero),
        positive_slots=int(positive_slots),
    )


def triplet(
    relevance,
    scores,
    margin: float = 0.2,
    mining: str = "all",
    distance: str = "squared_euclidean",
    positive_mining: str = "all",
    max_violation: bool = False,
    average_nonzero: bool = False,
    positive_slots: int = 8,
):
    """FaceNet triplet loss ``[m + D(a,p) - D(a,n)]_+`` on S; every option in the module docstring."""
    options = check_triplet(
        margin, mining, distance, positive_mining, max_violation, average_nonzero, positive_slots, owner="triplet"
    )
    margin, mining, distance = options["margin"], options["mining"], options["distance"]
    average_nonzero = options["average_nonzero"]
    positive, negative = pair_masks(relevance)
    if positive_mining == "hard":
        hardest, _ = miners.hardest_positive_indices(relevance, scores)
        positive = positive & tf.one_hot(hardest, tf.shape(scores)[1], on_value=True, off_value=False)
    kept = positive & row_any(negative)
    if mining == "hard":
        dist = distance_from_similarity(scores, distance)
        per_pair = tf.nn.relu(margin + dist - masked_min(dist, negative))
        return masked_mean(per_pair, kept)
    if mining == "semi-hard" and positive_mining == "hard":  # one positive per row: no sort
        dist = distance_from_similarity(scores, distance)
        farther = negative & (scores < masked_min(scores, positive))
        semi_hard = tf.where(row_any(farther), masked_min(dist, farther), masked_max(dist, negative))
        return masked_mean(tf.nn.relu(margin + dist - semi_hard), kept)
    kept_count = tf.maximum(tf.reduce_sum(tf.cast(kept, tf.float32)), 1.0)
    num_negatives = tf.reduce_sum(tf.cast(negative, tf.float32), axis=1, keepdims=True)
    has_negative = row_any(negative)

    if mining == "semi-hard":

        def make_semi_hard_slot(s):
            d = distance_from_similarity(s, distance)
            farthest_column = tf.argmin(tf.where(negative, s, tf.fill(tf.shape(s), float("inf"))), 1, tf.int32)
            farthest = tf.gather(d, farthest_column[:, None], batch_dims=1)

            def slot(columns, valid):  # closest negative below S_ap, by a masked arg-max over the row: O(N M)
                s_ap = tf.gather(s, columns[:, None], batch_dims=1)
                farther = negative & (s < s_ap)
                nearest = tf.argmax(tf.where(farther, s, tf.fill(tf.shape(s), float("-inf"))), 1, tf.int32)
                d_an = tf.where(row_any(farther), tf.gather(d, nearest[:, None], batch_dims=1), farthest)
                hinge = tf.nn.relu(margin + tf.gather(d, columns[:, None], batch_dims=1) - d_an)
                return tf.reduce_sum(tf.where(valid[:, None] & has_negative, hinge, tf.zeros_like(hinge))), ()

            return slot

        def semi_hard_sorted(s):  # the miner's one sort per row, for rows with many positives
            d = distance_from_similarity(s, distance)
            index, _ = miners.semi_hard_negative_indices(relevance, s)
            per_pair = tf.nn.relu(margin + d - tf.gather(d, index, batch_dims=1))
            return tf.reduce_sum(tf.where(kept, per_pair, tf.zeros_like(per_pair))), ()

        total, _ = over_positive_slots(
            scores, positive, options["positive_slots"], make_semi_hard_slot, semi_hard_sorted
        )
        return total / kept_count

    # 'all': the differentiated sum is of hinge sums (average_nonzero) or of per-pair means over negatives;
    # the active-triplet count is gradient-free.
    def reduce(hinge_sum, active, mask):
        value = hinge_sum if average_nonzero else hinge_sum / tf.maximum(num_negatives, 1.0)
        return tf.reduce_sum(tf.where(mask, value, tf.zeros_like(value))), (
            tf.reduce_sum(tf.where(mask, active, tf.zeros_like(active))),
        )

    def make_all_slot(s):
        d = distance_from_similarity(s, distance)

        def slot(columns, valid):  # sum over the row's negatives of [m + D_ap - D_an]_+, per pair: O(N M)
            threshold = margin + tf.gather(d, columns[:, None], batch_dims=1)
            hinge_sum = tf.reduce_sum(tf.where(negative, tf.nn.relu(threshold - d), tf.zeros_like(d)), 1, True)
            active = tf.reduce_sum(tf.cast(negative & (d < threshold), tf.float32), axis=1, keepdims=True)
            return reduce(hinge_sum, active, valid[:, None] & has_negative)

        return slot

    def all_sorted(s):
        d = distance_from_similarity(s, distance)
        threshold = tf.where(kept, margin + d, tf.zeros_like(d))
        active, below = count_below(threshold, d, negative)
        return reduce(active * threshold - below, active, kept)  # count * t - sum below = sum of hinges

    total, (active_total,) = over_positive_slots(scores, positive, options["positive_slots"], make_all_slot, all_sorted)
    if average_nonzero:
        return total / tf.maximum(active_total, 1.0)
    return total / kept_count


@register
class TripletLoss(RetrievalLoss):
    """FaceNet triplet loss ``[m + D(a,p) - D(a,n)]_+`` on S; see the module docstring for every option."""

    function = triplet
    check = staticmethod(check_triplet)


__all__ = ["TripletLoss"]
