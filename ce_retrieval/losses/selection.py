"""Exact k-th largest value of a (masked) tensor without sorting: radix selection on float bits.

Negative mining (stochastic negative mining, eq. 3, and cross-example negative mining, eq. 6 of
Veit & Wilber 2020) keeps the top-k negative logits. A sort or ``tf.math.top_k`` over the N x M negatives
costs O(NM log k) and dominates the loss at large N. But a top-k *sum* only needs the threshold
``t = k-th largest``:

    sum_{s in topk(V)} f(s) = sum_{s > t} f(s) + (k - #{s > t}) * f(t)                       (exact with ties)

This module finds ``t`` (and the counts ``#{s > t}``, ``#{s == t}``) by most-significant-digit radix
selection. Every float32 ``x`` is mapped to an int32 key with the same order, ``key(x) = x.bits`` for
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


__all__ = ["KthLargest", "kth_largest", "select_kth_largest", "ordered_int32_key", "key_to_float32"]
