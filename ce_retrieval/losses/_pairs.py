"""Building blocks shared by the pair/triplet losses and the miners (private: not re-exported).

Everything works on a similarity matrix ``S [N, M]`` (cosine similarity of L2-normalised embeddings) and a
relevance matrix ``R`` in {-1, 0, 1}. Distances follow from the unit sphere identity

    ||x - y||^2 = 2 - 2 x.y        =>   d2 = 2 - 2 s,   d = sqrt(d2),   cosine distance = 1 - s,

so a loss stated with Euclidean distances (Hadsell, FaceNet, Oh Song) is evaluated exactly on ``S``.

The masked reductions are written for XLA (no boolean indexing, no ragged shapes): masked entries are
replaced by neutral values with ``tf.where`` *before* any non-linear op, so neither the value nor the
gradient sees them (no ``inf * 0`` NaNs).
"""
from __future__ import annotations

import functools

import tensorflow as tf

#: Stand-in for -inf in masked log-sum-exp: finite, so ``softplus(NEG) == 0`` with a zero gradient.
NEG = -1e9
DISTANCES = ("squared_euclidean", "euclidean", "cosine")


def pair_masks(relevance: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Boolean ``(positive, negative)`` masks; ignored pairs (-1) are in neither."""
    return tf.equal(relevance, 1.0), tf.equal(relevance, 0.0)


def check_distance(distance: str, owner: str) -> str:
    if distance not in DISTANCES:
        raise ValueError(f"{owner}: distance must be one of {DISTANCES}, got {distance!r}")
    return distance


def distance_from_similarity(scores: tf.Tensor, distance: str) -> tf.Tensor:
    """Distance matrix from cosine similarities on the unit sphere.

    ``squared_euclidean``: ``2 - 2s`` (clipped at 0); ``euclidean``: ``sqrt(2 - 2s)`` with the argument clipped
    at 1e-12 so that coincident points get a zero (not infinite) gradient; ``cosine``: ``1 - s``.
    """
    if distance == "cosine":
        return 1.0 - scores
    squared = tf.maximum(2.0 - 2.0 * scores, 0.0)
    if distance == "squared_euclidean":
        return squared
    if distance == "euclidean":
        return tf.sqrt(tf.maximum(squared, 1e-12))
    raise ValueError(f"unknown distance {distance!r}; expected one of {DISTANCES}")


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


def masked_mean(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """Mean of ``values`` over ``mask`` (0 when the mask is empty)."""
    mask = tf.cast(mask, tf.bool)
    total = tf.reduce_sum(tf.where(mask, values, tf.zeros_like(values)))
    return total / tf.maximum(tf.reduce_sum(tf.cast(mask, values.dtype)), 1.0)


def masked_max(x: tf.Tensor, mask: tf.Tensor, axis: int = -1, keepdims: bool = True) -> tf.Tensor:
    """Max over ``mask`` (``NEG`` where the mask is empty); gradient flows to the arg-max entry only."""
    return tf.reduce_max(tf.where(tf.cast(mask, tf.bool), x, NEG * tf.ones_like(x)), axis=axis, keepdims=keepdims)


def masked_min(x: tf.Tensor, mask: tf.Tensor, axis: int = -1, keepdims: bool = True) -> tf.Tensor:
    """Min over ``mask`` (``-NEG`` where the mask is empty)."""
    return tf.reduce_min(tf.where(tf.cast(mask, tf.bool), x, -NEG * tf.ones_like(x)), axis=axis, keepdims=keepdims)


def row_any(mask: tf.Tensor, keepdims: bool = True) -> tf.Tensor:
    return tf.reduce_any(tf.cast(mask, tf.bool), axis=-1, keepdims=keepdims)


def count_below(thresholds: tf.Tensor, values: tf.Tensor, value_mask: tf.Tensor, inclusive: bool = False):
    """Per row, how many masked ``values`` lie below each threshold, and their sum, in O(M log M) per row.

    For every ``[a, j]``::

        count[a, j] = #{n : value_mask[a, n] and values[a, n] <  thresholds[a, j]}   (<= with inclusive)
        total[a, j] = sum of those values[a, n]

    Why: sum_n [t_aj - v_an]_+ = count * t_aj - total turns the all-triplets hinge sum (an [N, M, M] tensor)
    into a merge of two sorted lists per row. The row's thresholds and values are concatenated and sorted
    once (a stable sort; ties resolved by the concatenation order, which implements < versus <=); running
    sums of the value indicator and of the values along the merged order, read back at each threshold's
    position (the inverse permutation, by a scatter), give ``count`` and ``total``. Cost: one argsort of
    ``[N, 2M]``, two cumsums, a scatter and gathers: O(N M log M) time and O(N M) memory, also under XLA
    (``tf.searchsorted`` would be shorter, but XLA lowers it to an ``[N, M, M]`` comparison).
    ``total`` is differentiable in ``values`` (through the gathers); ``count`` is piecewise constant.
    Thresholds must be finite.
    """
    m = tf.shape(values)[1]
    value_mask = tf.cast(value_mask, tf.bool)
    value_keys = tf.where(value_mask, values, tf.fill(tf.shape(values), float("inf")))
    is_value = tf.cast(value_mask, values.dtype)
    masked_values = tf.where(value_mask, values, tf.zeros_like(values))
    zeros = tf.zeros_like(thresholds)
    if inclusive:  # values first: a value equal to a threshold sorts before it and is counted
        keys = tf.concat([value_keys, thresholds], axis=1)
        indicator = tf.concat([is_value, zeros], axis=1)
        summand = tf.concat([masked_values, zeros], axis=1)
    else:
        keys = tf.concat([thresholds, value_keys], axis=1)
        indicator = tf.concat([zeros, is_value], axis=1)
        summand = tf.concat([zeros, masked_values], axis=1)
    order = tf.argsort(tf.stop_gradient(keys), axis=1, stable=True)
    running_count = tf.cumsum(tf.gather(indicator, order, batch_dims=1), axis=1)
    running_total = tf.cumsum(tf.gather(summand, order, batch_dims=1), axis=1)
    position = inverse_permutation(order)
    threshold_position = position[:, m:] if inclusive else position[:, :m]
    count = tf.gather(running_count, threshold_position, batch_dims=1)
    total = tf.gather(running_total, threshold_position, batch_dims=1)
    return count, total


def inverse_permutation(order: tf.Tensor) -> tf.Tensor:
    """Row-wise inverse of a permutation ``[N, L]``: ``out[a, order[a, k]] = k`` (one scatter, O(N L))."""
    shape = tf.shape(order)
    rows = tf.broadcast_to(tf.range(shape[0])[:, None], shape)
    ranks = tf.broadcast_to(tf.range(shape[1])[None, :], shape)
    return tf.scatter_nd(tf.stack([rows, order], axis=-1), ranks, shape)


def require_square(scores: tf.Tensor, owner: str) -> tf.Tensor:
    """Asserts ``N == M`` (query set == document set); returns ``scores`` with the check attached."""
    shape = scores.shape
    if shape.rank == 2 and shape[0] is not None and shape[1] is not None and shape[0] != shape[1]:
        raise ValueError(
            f"{owner} needs a square similarity matrix S = E E^T (queries and documents are the same items), "
            f"got shape {shape}"
        )
    check = tf.debugging.assert_equal(
        tf.shape(scores)[0], tf.shape(scores)[1], message=f"{owner} needs a square similarity matrix S = E E^T"
    )
    with tf.control_dependencies([check]):
        return tf.identity(scores)


def next_positive_columns(positive: tf.Tensor, after: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Per row, the first positive column after column ``after[a]`` (the first one at all if ``after`` is None).

    Returns ``(columns int32 [N], valid bool [N])``; ``valid`` is false where the row has no such positive.
    An arg-max over ``[N, M]`` (a cumulative count would be simpler but ``cumsum`` is 5x dearer on CPU).
    """
    positive = tf.cast(positive, tf.bool)
    if after is not None:
        positive = positive & (tf.range(tf.shape(positive)[1])[None, :] > after[:, None])
    columns = tf.argmax(tf.cast(positive, tf.int8), axis=1, output_type=tf.int32)
    return columns, tf.gather(positive, columns[:, None], batch_dims=1)[:, 0]


#: Slot counts compiled for ``over_positive_slots`` (a batch runs the smallest count covering its rows).
SLOT_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def over_positive_slots(scores: tf.Tensor, positive: tf.Tensor, max_slots: int, make_slot, general):
    """A pair loss summed over every positive pair, one *slot* at a time when no row has more than ``max_slots``
    positives; ``general(scores)`` otherwise. Returns ``(value, counts)``.

    Why: P x K batches (and image-text batches) have a handful of positives per row, so a loss that needs a
    row-wide computation *per positive pair* (a semi-hard negative, a hinge sum over the negatives, an
    ``[a, p]`` entry of a matrix product) costs O(K N M) this way instead of a per-row sort (O(N M log M))
    or an ``[N, N] x [N, N]`` matmul (O(N^3)). Slot ``j`` pairs every row ``a`` with its ``j``-th positive
    column ``columns[a]`` (``valid[a]`` false if the row has fewer).

    Contract: ``make_slot(s)`` returns ``slot(columns, valid) -> (value, counts)``: ``value`` a scalar
    differentiable in ``s``, ``counts`` a tuple of gradient-free scalars (e.g. active-triplet counts); slot
    results are summed. ``general(s)`` returns the same structure for the whole batch. Everything that
    depends on the scores must be computed from ``s`` (the gradient is taken with respect to it).

    How: the batch's largest positive count picks, with one ``tf.switch_case``, a branch that runs the
    smallest count of ``SLOT_BUCKETS`` covering it (unrolled, so XLA sees static shapes; at most 1.5x the
    slots needed) or the general branch. Each branch computes its value *and* its gradient ``d value / d s``
    (an inner tape) and the op carries that gradient (``tf.custom_gradient``): the branches need not hand
    their intermediates to the backward pass, which under XLA would mean zero-filled copies of every other
    branch's ``[N, M]`` temporaries. Consequences: the gradient is computed even when only the value is
    needed, second derivatives are not available, and variables read inside get no gradient (the losses read
    none).
    """
    if max_slots <= 0:
        return general(scores)
    positive = tf.cast(positive, tf.bool)
    end = tf.shape(positive)[1]
    buckets = [k for k in SLOT_BUCKETS if k < max_slots] + [max_slots]
    most = tf.reduce_max(tf.reduce_sum(tf.cast(positive, tf.int32), axis=1))
    branch = tf.reduce_sum(tf.cast(most > tf.constant(buckets), tf.int32))  # len(buckets): the general path

    def slots(s, count):
        slot = make_slot(s)
        cursor, value, counts = None, None, None
        for _ in range(count):  # a static number of positive slots, not a loop over batch elements
            columns, valid = next_positive_columns(positive, after=cursor)
            cursor = tf.where(valid, columns, end)  # a row out of positives stays out
            part, part_counts = slot(columns, valid)
            if value is None:
                value, counts = part, tuple(part_counts)
            else:
                value, counts = value + part, tuple(map(tf.add, counts, part_counts))
        return value, counts

    def with_gradient(fn, s):
        def run():
            with tf.GradientTape() as tape:
                tape.watch(s)
                value, counts = fn(s)
            gradient = tape.gradient(value, s, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            return (value, *counts, gradient)

        return run

    @tf.custom_gradient
    def evaluate(s):
        fns = [functools.partial(slots, count=k) for k in buckets] + [general]
        *outputs, gradient = tf.switch_case(branch, [with_gradient(fn, s) for fn in fns])

        def grad_fn(upstream, *unused_count_upstreams, variables=None):
            # variables read inside (e.g. a counter) are state, not parameters: no gradient flows to them
            return upstream * gradient, [None] * len(variables or ())

        return outputs, grad_fn

    value, *counts = evaluate(scores)
    return value, tuple(counts)
