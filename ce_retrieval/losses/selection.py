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
    """int32 keys with ``key(a) < key(b)`` iff ``a < b`` for non-NaN float32 (sign-magnitude to two's complement)."""
    bits = tf.bitcast(tf.cast(values, tf.float32), tf.int32)
    magnitude = tf.bitwise.bitwise_and(bits, _MAGNITUDE)
    return tf.where(bits < 0, -magnitude, magnitude)


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
    if sum(passes) != 32 or any(b < 1 or b > 24 for b in passes):
        raise ValueError(f"kth_largest: passes must be digit widths in [1, 24] summing to 32, got {passes}")

    values = tf.stop_gradient(tf.cast(values, tf.float32))
    key = ordered_int32_key(values)
    if mask is not None:
        # Masked-out entries get INT32_MIN: they fall into the lowest bin of the first pass, below every
        # real key (real keys are >= -0x7f800000), and never match a later prefix.
        key = tf.where(mask, key, tf.constant(_INT32_MIN, tf.int32))

    if axis is None:
        flat = tf.reshape(key, [1, -1])
        count = (
            tf.size(key, out_type=tf.int32)
            if mask is None
            else tf.reduce_sum(tf.cast(tf.reshape(mask, [-1]), tf.int32))
        )
        k = tf.reshape(tf.cast(k, tf.int32), [1])
        result = _radix_select(flat, k, tf.reshape(count, [1]), passes, per_row=False)
        return KthLargest(*(tf.reshape(r, []) for r in result))

    lead = tf.shape(key)[:-1]
    width = tf.shape(key)[-1]
    rows = tf.reshape(key, [-1, width])
    if mask is None:
        count = tf.fill(tf.shape(rows)[:1], width)
    else:
        count = tf.reduce_sum(tf.cast(tf.reshape(mask, [-1, width]), tf.int32), axis=-1)
    k = tf.reshape(tf.broadcast_to(tf.cast(k, tf.int32), lead), [-1])
    result = _radix_select(rows, k, count, passes, per_row=True)
    return KthLargest(*(tf.reshape(r, lead) for r in result))


def _histogram(digits: tf.Tensor, size: int, per_row: bool) -> tf.Tensor:
    """Counts of ``digits`` in ``[0, size)`` per row ``[R, size]``; digits >= size are dropped."""
    empty = tf.zeros([0], tf.int32)
    if per_row:
        return gen_math_ops.dense_bincount(input=digits, size=size, weights=empty, binary_output=False)
    flat = tf.reshape(digits, [-1])
    return gen_math_ops.dense_bincount(input=flat, size=size, weights=empty, binary_output=False)[None, :]


def _radix_select(key, k, count, passes, per_row: bool):
    """Radix selection on ``key [R, M]`` (masked-out = INT32_MIN), ``k, count [R]``; returns value, greater, equal."""
    remaining = tf.clip_by_value(k, 1, tf.maximum(count, 1))  # rank of the target among the candidates
    greater = tf.zeros_like(remaining)
    prefix = None
    shift = 32
    chosen_count = None
    for level, bits in enumerate(passes):
        shift -= bits
        size = 2**bits
        shifted = tf.bitwise.right_shift(key, shift) if shift else key
        if level == 0:
            # key >> shift lies in [-2^(bits-1), 2^(bits-1)); offset it to a bin index in [0, 2^bits).
            digits = shifted + size // 2
        else:
            # Entries whose higher digits equal the prefix get shifted - prefix*size in [0, size); the others
            # fall outside, and the unsigned minimum sends negatives (and large values) to the dropped bin.
            offset = shifted - (prefix * size)[:, None]
            digits = tf.bitcast(tf.minimum(tf.bitcast(offset, tf.uint32), tf.constant(size, tf.uint32)), tf.int32)
        hist = _histogram(digits, size, per_row)  # [R, size]
        at_or_above = tf.cumsum(hist, axis=-1, reverse=True)
        # Highest bin whose count of entries at or above it reaches the remaining rank.
        digit = tf.reduce_sum(tf.cast(at_or_above >= remaining[:, None], tf.int32), axis=-1) - 1
        digit = tf.maximum(digit, 0)
        in_bin = tf.gather(hist, digit, batch_dims=1)
        above = tf.gather(at_or_above, digit, batch_dims=1) - in_bin
        greater += above
        remaining -= above
        chosen_count = in_bin
        prefix = digit - size // 2 if level == 0 else prefix * size + digit
    nonempty = count > 0
    value = tf.where(nonempty, key_to_float32(prefix), tf.constant(-float("inf"), tf.float32))
    zero = tf.zeros_like(greater)
    return value, tf.where(nonempty, greater, zero), tf.where(nonempty, chosen_count, zero)


__all__ = ["KthLargest", "kth_largest", "select_kth_largest", "ordered_int32_key", "key_to_float32"]
