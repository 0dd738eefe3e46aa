"""Miners: which pairs of a batch a pair/triplet loss should look at, as masks or indices over ``S``.

All miners take ``(relevance, scores)`` exactly as the losses do (``S [N, M]`` cosine similarities, relevance
in {-1, 0, 1}; ignored pairs are never mined) and are vectorised, XLA-compilable and gradient-free (they
return selections; the loss gathers the scores it differentiates). On the unit sphere every distance used
by the losses is a decreasing function of ``s``, so "closer" means "larger s" whatever the distance:

* hardest negative / positive of a row (batch-hard, Hermans et al. 2017; VSE++'s max violation):
  ``argmax_{n in Neg_a} s_an`` and ``argmin_{p in Pos_a} s_ap``;
* hard negatives (ProbML 16.2.5.1): ``n`` with ``s_an + margin > min_{p in Pos_a} s_ap``, i.e. closer
  (up to the margin) than the anchor's farthest positive, so it violates at least one triplet;
* semi-hard negative per positive pair (FaceNet, Schroff et al. 2015): the closest negative that is still
  farther than the positive, ``argmax {s_an : s_an < s_ap}``; when none exists, the farthest negative
  ``argmin s_an`` (the fallback of tf-addons / TF-Similarity);
* multi-similarity pair mining (Wang et al. 2019, epsilon = 0.1): keep negative ``(a, n)`` if
  ``s_an + eps > min_{p} s_ap`` and positive ``(a, p)`` if ``s_ap - eps < max_{n} s_an``;
* distance-weighted sampling (Wu et al. 2017): negatives drawn with probability proportional to
  ``q(d)^-1``, where ``q(d) ∝ d^(n-2) (1 - d^2/4)^((n-3)/2)`` is the density of distances between uniform
  points on the unit sphere in R^n, d clipped below at ``cutoff`` (0.5) and pairs beyond
  ``nonzero_loss_cutoff`` (1.4) excluded.

Semi-hard mining per positive pair would be an ``[N, M, M]`` comparison; one stable sort per row merges the
row's negatives with its positives instead: O(N M log M) time, O(N M) memory.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses._similarity import squared_distance
from ce_retrieval.losses.kernels.fast_paths import inverse_permutation
from ce_retrieval.losses.kernels.masked import masked_max, masked_min, pair_masks, row_any


def _inputs(relevance, scores):
    scores = tf.cast(tf.convert_to_tensor(scores), tf.float32)
    relevance = tf.cast(tf.convert_to_tensor(relevance), tf.float32)
    if scores.shape.rank != 2 or relevance.shape.rank != 2:
        raise ValueError(
            f"miners need rank-2 relevance and scores [N, M], got shapes {relevance.shape} and {scores.shape}"
        )
    return relevance, scores


def hardest_negative_indices(relevance, scores) -> tuple[tf.Tensor, tf.Tensor]:
    """Per row, the column of its most similar negative: ``(indices int32 [N], valid bool [N])``."""
    relevance, scores = _inputs(relevance, scores)
    _, negative = pair_masks(relevance)
    masked = tf.where(negative, scores, tf.fill(tf.shape(scores), float("-inf")))
    return tf.argmax(masked, axis=1, output_type=tf.int32), row_any(negative, keepdims=False)


def hardest_positive_indices(relevance, scores) -> tuple[tf.Tensor, tf.Tensor]:
    """Per row, the column of its least similar positive: ``(indices int32 [N], valid bool [N])``."""
    relevance, scores = _inputs(relevance, scores)
    positive, _ = pair_masks(relevance)
    masked = tf.where(positive, scores, tf.fill(tf.shape(scores), float("inf")))
    return tf.argmin(masked, axis=1, output_type=tf.int32), row_any(positive, keepdims=False)


def hard_negative_mask(relevance, scores, margin: float = 0.0) -> tf.Tensor:
    """``bool [N, M]``: negatives with ``s_an + margin > min_p s_ap`` (rows without positives mine nothing)."""
    relevance, scores = _inputs(relevance, scores)
    positive, negative = pair_masks(relevance)
    farthest_positive = masked_min(scores, positive)
    return negative & (scores + margin > farthest_positive) & row_any(positive)


def semi_hard_negative_indices(relevance, scores) -> tuple[tf.Tensor, tf.Tensor]:
    """FaceNet semi-hard negative of every positive pair: ``(indices int32 [N, M], valid bool [N, M])``.

    ``indices[a, p]`` is the column of the negative with the largest ``s_an`` below ``s_ap`` (the closest
    negative farther than the positive); if no negative of row ``a`` is farther, the farthest negative.
    ``valid`` is true on positive pairs whose row has a negative; elsewhere ``indices`` is meaningless.
    """
    relevance, scores = _inputs(relevance, scores)
    positive, negative = pair_masks(relevance)
    # In "distance" order u = -s (ascending = farther). One stable sort merges the row's negatives (first, so
    # that a negative tied with a positive counts as not farther) with its positives' thresholds.
    u = -scores
    n, m = tf.shape(u)[0], tf.shape(u)[1]
    inf = tf.fill(tf.shape(u), float("inf"))
    keys = tf.stop_gradient(tf.concat([tf.where(negative, u, inf), u], axis=1))
    order = tf.argsort(keys, axis=1, stable=True)  # [N, 2M]; negatives' entries are the columns < M
    is_negative = tf.gather(tf.concat([negative, tf.zeros_like(negative)], axis=1), order, batch_dims=1)
    rank = tf.cumsum(tf.cast(is_negative, tf.int32), axis=1)  # negatives at or before each merged position
    # column of the k-th nearest negative (k = 0, 1, ...); every other entry lands in a spare column M
    slot = tf.where(is_negative, rank - 1, m)
    rows = tf.broadcast_to(tf.range(n)[:, None], tf.shape(order))
    nearest = tf.tensor_scatter_nd_update(
        tf.zeros([n, m + 1], tf.int32), tf.stack([rows, slot], axis=-1), tf.where(is_negative, order, 0)
    )
    position = inverse_permutation(order)[:, m:]  # where each pair's threshold sits in the merged order
    not_farther = tf.gather(rank, position, batch_dims=1)
    num_negatives = tf.reduce_sum(tf.cast(negative, tf.int32), axis=1, keepdims=True)
    # The first farther negative is the `not_farther`-th nearest; if there is none, the farthest one.
    indices = tf.gather(nearest, tf.minimum(not_farther, tf.maximum(num_negatives - 1, 0)), batch_dims=1)
    return indices, positive & (num_negatives > 0)


def multi_similarity_masks(relevance, scores, epsilon: float = 0.1) -> tuple[tf.Tensor, tf.Tensor]:
    """Multi-similarity pair mining: ``(positive_mask, negative_mask)``, both ``bool [N, M]``.

    A negative is kept if ``s_an + eps > min_p s_ap`` (harder than the hardest positive up to eps), a positive
    if ``s_ap - eps < max_n s_an``. A row without negatives keeps no positive, a row without positives keeps
    no negative (the reference implementation skips such anchors).
    """
    relevance, scores = _inputs(relevance, scores)
    positive, negative = pair_masks(relevance)
    keep_negative = negative & (scores + epsilon > masked_min(scores, positive)) & row_any(positive)
    keep_positive = positive & (scores - epsilon < masked_max(scores, negative)) & row_any(negative)
    return keep_positive, keep_negative


def distance_weighted_negatives(
    relevance,
    scores,
    embedding_dim: int,
    num_samples: int = 1,
    cutoff: float = 0.5,
    nonzero_loss_cutoff: float = 1.4,
    seed=None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Distance-weighted negative sampling (Wu et al. 2017): ``(indices int32 [N, num_samples], valid [N])``.

    ``log w(d) = -(n - 2) log d - (n - 3)/2 log(1 - d^2/4)`` with ``d = sqrt(2 - 2s)`` clipped to
    ``[cutoff, 2)`` and ``n = embedding_dim``; negatives with ``d >= nonzero_loss_cutoff`` get weight 0
    (they would give zero margin loss). Rows with no such negative sample uniformly among their negatives;
    rows without any negative are not ``valid``. ``seed``: a shape-[2] integer seed for a deterministic,
    stateless draw (``tf.random.stateless_categorical``); None uses the global generator.
    """
    if embedding_dim < 2:
        raise ValueError(f"distance_weighted_negatives: embedding_dim must be >= 2, got {embedding_dim}")
    if num_samples < 1:
        raise ValueError(f"distance_weighted_negatives: num_samples must be >= 1, got {num_samples}")
    relevance, scores = _inputs(relevance, scores)
    _, negative = pair_masks(relevance)
    distance = tf.sqrt(squared_distance(scores))
    clipped = tf.clip_by_value(distance, cutoff, 2.0 - 1e-4)
    n = float(embedding_dim)
    log_weight = -(n - 2.0) * tf.math.log(clipped) - 0.5 * (n - 3.0) * tf.math.log(1.0 - 0.25 * clipped**2)
    candidate = negative & (distance < nonzero_loss_cutoff)
    has_candidate = row_any(candidate)
    candidate = tf.where(has_candidate, candidate, negative)  # fallback: uniform over the row's negatives
    log_weight = tf.where(has_candidate, log_weight, tf.zeros_like(log_weight))
    logits = tf.where(candidate, log_weight, tf.fill(tf.shape(log_weight), float("-inf")))
    logits = logits - tf.reduce_max(tf.where(candidate, logits, tf.fill(tf.shape(logits), -1e30)), 1, keepdims=True)
    valid = row_any(negative, keepdims=False)
    logits = tf.where(valid[:, None], logits, tf.zeros_like(logits))  # any finite row; result marked invalid
    if seed is None:
        indices = tf.random.categorical(logits, num_samples, dtype=tf.int32)
    else:
        indices = tf.random.stateless_categorical(logits, num_samples, seed=seed, dtype=tf.int32)
    return tf.stop_gradient(indices), valid


__all__ = [
    "distance_weighted_negatives",
    "hard_negative_mask",
    "hardest_negative_indices",
    "hardest_positive_indices",
    "multi_similarity_masks",
    "semi_hard_negative_indices",
]
