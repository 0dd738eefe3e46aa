"""The loss package's speed paths: each is exact (the same value and gradient as the plain computation it
replaces), each is tested against that plain reference in ``tests/losses/test_fast_paths.py``, and each keeps
second derivatives (tested with nested ``tf.GradientTape``s).

* **Radix selection** (:func:`select_kth_largest`, :func:`kth_largest`) and the top-k weights built on it
  (:func:`top_k_weights`): negative mining (stochastic negative mining, eq. 3, and cross-example negative
  mining, eq. 6 of Veit & Wilber 2020) keeps the top-k negative logits. A sort or ``tf.math.top_k`` over the
  N x M negatives costs O(NM log k) and dominates the loss at large N. But a top-k *sum* only needs the
  threshold ``t = k-th largest``::

      sum_{s in topk(V)} f(s) = sum_{s > t} f(s) + (k - #{s > t}) * f(t)                     (exact with ties)

  Plain reference: ``tf.math.top_k`` / a sort. The selection carries no gradient (its input is
  ``stop_gradient``-ed) and the weights are piecewise constant, so a mined sum has the first and second
  derivatives of the plain top-k sum (the selected set is a constant of the differentiation either way).
* **Positive slots** (:func:`over_positive_slots`, :data:`SLOT_BUCKETS`): a pair loss summed over the positive
  pairs one positive *slot* at a time, O(K N M) for K positives per row, instead of a per-row sort or an
  ``[N, N] x [N, N]`` matmul. Plain reference: the caller's ``general`` path (``positive_slots=0`` of the
  triplet and angular losses). Its custom gradient is itself differentiable, so second derivatives are kept.
* **Sorted merge** (:func:`count_below`): the all-triplets hinge sum without an ``[N, M, M]`` tensor, O(N M log M).
  Plain reference: the dense ``[N, M, M]`` hinge sum. Differentiable through gathers and cumulative sums
  (linear in the values): second derivatives are kept.

Radix selection in detail. It finds ``t`` (and the counts ``#{s > t}``, ``#{s == t}``) by most-significant-digit
radix selection. Every float32 ``x`` is mapped to an int32 key with the same order, ``key(x) = x.bits`` for
``x >= 0`` and ``-(x.bits & 0x7fffffff)`` for ``x < 0`` (so ``-0.0`` and ``+0.0`` share key 0; equal floats
have equal keys). Each pass histograms one digit of the keys (``tf.math.bincount``, per row or global)
among the entries whose higher digits equal the prefix chosen so far, then walks the histogram from the
top to the bin holding the k-th largest. Two passes of 16 bits (global) or three of 11/11/10 bits (per
row, histograms of ``rows x 2048`` bins) give the exact key; the cost is a few linear counting passes,
vectorised over rows, traceable under ``tf.function`` and XLA, with static shapes.
Conventions: ``k`` is clipped to ``[1, n]`` where ``n`` is the number of masked-in entries (of a row for
``axis=-1``); a slice with ``n == 0`` gives ``-inf`` and zero counts. Inputs must not contain NaN. float16
and bfloat16 are widened to float32 exactly; float64 is rejected (keys would need 64 bits).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import tensorflow as tf
from tensorflow.python.ops import gen_math_ops

_INT32_MIN = -(2**31)
_MAGNITUDE = 0x7FFFFFFF

#: Digit widths (most significant first) of the passes; each tuple sums to 32 bits.
GLOBAL_PASSES = (16, 16)
ROW_PASSES = (11, 11, 10)


class KthLargest(NamedTuple):
    """Result of :func:`select_kth_largest`: the threshold and the counts around it.

    ``value``: the k-th largest (float32); ``num_greater``: #{entries > value}; ``num_equal``:
    #{entries == value} (both int32, counting masked-in entries only). ``k - num_greater`` of the
    ``num_equal`` tied entries belong to the top k.
    """

    value: tf.Tensor
    num_greater: tf.Tensor
    num_equal: tf.Tensor


def ordered_int32_key(values: tf.Tensor) -> tf.Tensor:
    """int32 keys with ``key(a) < key(b)`` iff ``a < b`` for non-NaN float32 (sign-magnitude to two's complement).

    ``key = ((bits & 0x7fffffff) ^ m) - m`` with ``m = bits >> 31`` (0 or -1): the magnitude, negated for
    negative floats; integer arithmetic only (no select, which is slow for int32 on CPU).
    """
    bits = tf.bitcast(tf.cast(values, tf.float32), tf.int32)
    sign = tf.bitwise.right_shift(bits, 31)
    return tf.bitwise.bitwise_xor(tf.bitwise.bitwise_and(bits, _MAGNITUDE), sign) - sign


def key_to_float32(key: tf.Tensor) -> tf.Tensor:
    """Inverse of :func:`ordered_int32_key` (key 0 gives +0.0)."""
    bits = tf.where(key < 0, tf.bitwise.bitwise_or(-key, _INT32_MIN), key)
    return tf.bitcast(bits, tf.float32)


def kth_largest(values, k, mask=None, axis=None) -> tf.Tensor:
    """The k-th largest entry of ``values`` where ``mask`` is true (exact, ties counted with multiplicity).

    Args:
      values: float tensor (float16, bfloat16 or float32), no NaN.
      k: int; a scalar, or for ``axis=-1`` a tensor of shape ``values.shape[:-1]`` (one k per row).
        Clipped to ``[1, n]`` (n = masked-in entries of the slice).
      mask: optional bool tensor of ``values``' shape; False entries are ignored.
      axis: ``None`` selects over all entries (scalar result); ``-1`` selects per row along the last axis
        (result of shape ``values.shape[:-1]``).

    Returns:
      float32 tensor; ``-inf`` where the slice has no masked-in entry.
    """
    return select_kth_largest(values, k, mask=mask, axis=axis).value


def select_kth_largest(values, k, mask=None, axis=None, passes=None) -> KthLargest:
    """Like :func:`kth_largest`, also returning ``#{> value}`` and ``#{== value}`` (see :class:`KthLargest`).

    ``passes`` overrides the digit widths (most significant first, summing to 32); the default is
    :data:`GLOBAL_PASSES` for ``axis=None`` and :data:`ROW_PASSES` for ``axis=-1``.
    """
    values = tf.convert_to_tensor(values)
    if not values.dtype.is_floating:
        raise ValueError(f"kth_largest: values must be a floating tensor, got dtype {values.dtype.name}")
    if values.dtype == tf.float64:
        raise ValueError("kth_largest: float64 values are not supported (keys are 32-bit); cast to float32")
    if axis not in (None, -1):
        raise ValueError(f"kth_largest: axis must be None (whole tensor) or -1 (per row), got {axis!r}")
    if axis == -1 and values.shape.rank == 0:
        raise ValueError("kth_largest: axis=-1 needs values of rank >= 1")
    if isinstance(k, int) and not isinstance(k, bool) and k < 1:
        raise ValueError(f"kth_largest: k must be >= 1, got {k}")
    if mask is not None:
        mask = tf.convert_to_tensor(mask)
        if mask.dtype != tf.bool:
            raise ValueError(f"kth_largest: mask must be a bool tensor, got dtype {mask.dtype.name}")
        if values.shape.is_fully_defined() and mask.shape.is_fully_defined() and mask.shape != values.shape:
            raise ValueError(f"kth_largest: mask shape {mask.shape} does not match values shape {values.shape}")
    passes = tuple(passes) if passes is not None else (GLOBAL_PASSES if axis is None else ROW_PASSES)
    if sum(passes) != 32 or passes[0] < 8 or any(b < 1 or b > 24 for b in passes):
        raise ValueError(
            f"kth_largest: passes must be digit widths in [1, 24] summing to 32, the first >= 8; got {passes}"
        )

    values = tf.stop_gradient(tf.cast(values, tf.float32))
    if mask is not None:
        # Masked-out entries become -inf: at or below every real value. k is clipped to the masked-in count
        # n, so they only matter when the k-th largest is -inf itself, handled by the count fix below.
        values = tf.where(mask, values, float("-inf"))
    key = ordered_int32_key(values)

    if axis is None:
        rows = tf.reshape(key, [1, -1])
        count = tf.size(key, out_type=tf.int32) if mask is None else tf.reduce_sum(tf.cast(mask, tf.int32))
        count = tf.reshape(count, [1])
        k = tf.reshape(tf.cast(k, tf.int32), [1])
        lead = tf.constant([], tf.int32)
    else:
        lead = tf.shape(key)[:-1]
        width = tf.shape(key)[-1]
        rows = tf.reshape(key, [-1, width])
        if mask is None:
            count = tf.fill(tf.shape(rows)[:1], width)
        else:
            count = tf.reduce_sum(tf.cast(tf.reshape(mask, [-1, width]), tf.int32), axis=-1)
        k = tf.reshape(tf.broadcast_to(tf.cast(k, tf.int32), lead), [-1])
    value, greater, equal = _radix_select(rows, k, count, passes, per_row=axis is not None)
    if mask is not None:
        # A -inf threshold ties with the masked-out fillers: count the masked-in ties as n - greater.
        equal = tf.where(value == float("-inf"), count - greater, equal)
    return KthLargest(tf.reshape(value, lead), tf.reshape(greater, lead), tf.reshape(equal, lead))


def _histogram(digits: tf.Tensor, size: int, per_row: bool) -> tf.Tensor:
    """Counts of ``digits`` in ``[0, size)`` per row ``[R, size]``; digits >= size are dropped."""
    empty = tf.zeros([0], tf.int32)
    if per_row:
        return gen_math_ops.dense_bincount(input=digits, size=size, weights=empty, binary_output=False)
    flat = tf.reshape(digits, [-1])
    return gen_math_ops.dense_bincount(input=flat, size=size, weights=empty, binary_output=False)[None, :]


def _radix_select(key, k, count, passes, per_row: bool):
    """Radix selection on ``key [R, M]``, ``k, count [R]``; returns value, #greater, #equal (each ``[R]``)."""
    remaining = tf.clip_by_value(k, 1, tf.maximum(count, 1))  # rank of the target among the candidates
    greater = tf.zeros_like(remaining)
    prefix = None
    shift = 32
    in_bin = None
    for level, bits in enumerate(passes):
        shift -= bits
        size = 2**bits
        if level == 0:
            # key >> shift lies in [-2^(bits-1), 2^(bits-1)); offset it to a bin index in [0, 2^bits).
            digits = tf.bitwise.right_shift(key, shift) + size // 2
        else:
            # key - prefix * 2^(shift+bits) is in [0, 2^(shift+bits)) exactly for entries whose higher digits
            # equal the prefix. Read as uint32 and shifted, those give their digit in [0, size); every other
            # entry (below: wraps to >= 2^24 > 2^(shift+bits) since |key| < 2^31 - 2^23; above: too large)
            # lands at >= size, which the histogram drops.
            base = (prefix * size) * (2**shift)
            offset = tf.bitcast(key - base[:, None], tf.uint32)
            if shift:  # < 2^(32 - shift) <= 2^31: a valid non-negative int32
                digits = tf.bitcast(tf.bitwise.right_shift(offset, tf.constant(shift, tf.uint32)), tf.int32)
            else:
                digits = tf.bitcast(tf.minimum(offset, tf.constant(size, tf.uint32)), tf.int32)
        hist = _histogram(digits, size, per_row)  # [R, size]
        digit, above, in_bin = _find_bin(hist, remaining)
        greater += above
        remaining -= above
        prefix = digit - size // 2 if level == 0 else prefix * size + digit
    nonempty = count > 0
    value = tf.where(nonempty, key_to_float32(prefix), tf.constant(-float("inf"), tf.float32))
    zero = tf.zeros_like(greater)
    return value, tf.where(nonempty, greater, zero), tf.where(nonempty, in_bin, zero)


def _find_bin(hist, remaining, block: int = 32):
    """Per row: the highest bin d with #{entries in bins >= d} >= remaining; returns (d, #{bins > d}, hist[d]).

    Two-level scan (block totals, then within the chosen block) instead of a cumsum over all bins, which is
    slow on CPU for wide rows.
    """
    rows, size = tf.shape(hist)[0], hist.shape[-1]
    block = min(block, size)
    blocks = tf.reduce_sum(tf.reshape(hist, [rows, size // block, block]), axis=-1)
    digit_b, above_b, _ = _scan_bins(blocks, remaining)
    within = tf.gather(tf.reshape(hist, [rows, size // block, block]), digit_b, batch_dims=1)
    digit_w, above_w, in_bin = _scan_bins(within, remaining - above_b)
    return digit_b * block + digit_w, above_b + above_w, in_bin


def _scan_bins(hist, remaining):
    at_or_above = tf.cumsum(hist, axis=-1, reverse=True)
    digit = tf.maximum(tf.reduce_sum(tf.cast(at_or_above >= remaining[:, None], tf.int32), axis=-1) - 1, 0)
    in_bin = tf.gather(hist, digit, batch_dims=1)
    return digit, tf.gather(at_or_above, digit, batch_dims=1) - in_bin, in_bin


def top_k_weights(masked: tf.Tensor, k: tf.Tensor, axis=None) -> tf.Tensor:
    """Weights of the top-k entries of ``masked``: 1 above the k-th largest t, (k - #{> t}) / #{== t} at t,
    0 below; so ``sum(weights * f(masked))`` is the top-k sum of ``f`` with ties sharing the last places.

    ``masked`` float32 ``[N, M]`` holds the candidates and -inf elsewhere; ``k`` int32 of shape ``[N, 1]``
    (``axis=-1``, per row) or ``[1, 1]`` (``axis=None``, the whole matrix), at most the number of candidates,
    so the -inf fillers never reach the top k. No gradient flows through the weights.
    """
    masked = tf.stop_gradient(masked)
    selection_k = tf.reshape(k, []) if axis is None else k[:, 0]
    selected = select_kth_largest(masked, selection_k, axis=axis)
    shape = tf.shape(k)
    threshold = tf.reshape(selected.value, shape)
    greater = tf.reshape(selected.num_greater, shape)
    equal = tf.reshape(selected.num_equal, shape)
    tie_weight = tf.cast(k - greater, tf.float32) / tf.cast(tf.maximum(equal, 1), tf.float32)
    return tf.where(masked > threshold, 1.0, tf.where(masked == threshold, tie_weight, 0.0))


def count_below(
    thresholds: tf.Tensor, values: tf.Tensor, value_mask: tf.Tensor, inclusive: bool = False
) -> tuple[tf.Tensor, tf.Tensor]:
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


def over_positive_slots(
    scores: tf.Tensor, positive: tf.Tensor, max_slots: int, make_slot, general
) -> tuple[tf.Tensor, tuple]:
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
    needed, and variables read inside get no gradient (the losses read none). Second derivatives are kept: the
    carried gradient is computed by differentiable ops from ``s``, so an outer tape differentiates it (a
    nested-tape Hessian-vector product equals the general path's, in eager, graph and XLA mode).
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


__all__ = [
    "GLOBAL_PASSES",
    "KthLargest",
    "ROW_PASSES",
    "SLOT_BUCKETS",
    "count_below",
    "inverse_permutation",
    "key_to_float32",
    "kth_largest",
    "next_positive_columns",
    "ordered_int32_key",
    "over_positive_slots",
    "select_kth_largest",
    "top_k_weights",
]
