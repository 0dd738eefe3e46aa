"""k-th largest by radix selection against numpy sort: ties, masks, signed zeros, infinities, k edge cases."""
import numpy as np
import pytest
import tensorflow as tf

from ce_retrieval.losses.selection import key_to_float32, kth_largest, ordered_int32_key, select_kth_largest


def reference(values, k, mask):
    """(k-th largest, #greater, #equal) per row by full sort; k clipped to [1, n]; empty rows give -inf."""
    out = []
    for row, kk, m in zip(values, k, mask, strict=True):
        chosen = np.sort(row[m])[::-1]
        if len(chosen) == 0:
            out.append((-np.inf, 0, 0))
            continue
        t = chosen[min(max(kk, 1), len(chosen)) - 1]
        out.append((t, int(np.sum(chosen > t)), int(np.sum(chosen == t))))
    return out


def random_case(rng, trial, shape=None):
    rows, cols = shape or (rng.integers(1, 7), rng.integers(1, 30))
    values = (rng.normal(size=(rows, cols)) * 10.0 ** rng.integers(-4, 4)).astype(np.float32)
    if trial % 3 == 0:
        values = np.round(values)  # many exact ties
    if trial % 4 == 0:
        values[:, : cols // 2] = -0.0  # -0.0 and +0.0 are equal floats
    if trial % 5 == 0:
        values[0, 0], values[-1, -1] = np.inf, -np.inf
    mask = rng.random((rows, cols)) < 0.7
    if trial % 6 == 0:
        mask[0] = False  # an empty row
    k = rng.integers(-1, cols + 3, size=rows)
    return values, np.maximum(k, 0), mask


def assert_matches(result, expected):
    value, greater, equal = (np.atleast_1d(t.numpy()) for t in result)
    for i, (t, g, e) in enumerate(expected):
        assert value[i] == t and greater[i] == g and equal[i] == e, (i, value[i], greater[i], equal[i], t, g, e)


def test_eager_per_row_and_global_match_sort(rng):
    for trial in range(24):
        values, k, mask = random_case(rng, trial)
        assert_matches(select_kth_largest(values, k, mask, axis=-1), reference(values, k, mask))
        kg = int(rng.integers(1, values.size + 2))
        assert_matches(select_kth_largest(values, kg, mask), reference(values.reshape(1, -1), [kg], mask.reshape(1, -1)))


def test_xla_matches_sort(rng):
    per_row = tf.function(lambda v, k, m: select_kth_largest(v, k, m, axis=-1), jit_compile=True)
    whole = tf.function(lambda v, k, m: select_kth_largest(v, k, m), jit_compile=True)
    for trial in range(6):
        values, k, mask = random_case(rng, trial, shape=(5, 24))  # one shape: one trace / compilation
        assert_matches(per_row(values, k.astype(np.int32), mask), reference(values, k, mask))
        kg = np.int32(rng.integers(1, values.size + 2))
        assert_matches(whole(values, kg, mask), reference(values.reshape(1, -1), [kg], mask.reshape(1, -1)))


def test_eager_without_mask_with_scalar_k_and_leading_dims(rng):
    values = np.round(rng.normal(size=(2, 3, 17)) * 3).astype(np.float32)
    got = kth_largest(values, 5, axis=-1).numpy()
    want = np.sort(values, axis=-1)[..., ::-1][..., 4]
    np.testing.assert_array_equal(got, want)
    assert kth_largest(values, values.size + 10).numpy() == values.min()  # k > n uses n
    assert kth_largest(values, 1).numpy() == values.max()


def test_all_equal_values_and_half_precision(rng):
    values = np.full((3, 8), 0.25, np.float16)
    result = select_kth_largest(values, 4, axis=-1)
    np.testing.assert_array_equal(result.value.numpy(), [0.25] * 3)
    np.testing.assert_array_equal(result.num_greater.numpy(), [0] * 3)
    np.testing.assert_array_equal(result.num_equal.numpy(), [8] * 3)
    bf = tf.cast(rng.normal(size=(4, 9)), tf.bfloat16)
    want = np.sort(tf.cast(bf, tf.float32).numpy(), axis=-1)[:, ::-1][:, 2]
    np.testing.assert_array_equal(kth_largest(bf, 3, axis=-1).numpy(), want)


def test_key_is_order_preserving_and_invertible():
    x = np.array([-np.inf, -3e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1.0, 3e38, np.inf], np.float32)
    keys = ordered_int32_key(x).numpy()
    assert np.all(np.diff(keys[[0, 1, 2, 3, 4, 6, 7, 8, 9]]) > 0) and keys[4] == keys[5] == 0
    np.testing.assert_array_equal(key_to_float32(tf.constant(keys)).numpy(), np.where(x == 0, 0.0, x))


def test_custom_passes_give_same_result(rng):
    values = np.round(rng.normal(size=(5, 40)) * 4).astype(np.float32)
    expected = reference(values, [7] * 5, np.ones_like(values, bool))
    for passes in [(8, 8, 8, 8), (12, 10, 10), (16, 16), (8, 24)]:
        assert_matches(select_kth_largest(values, 7, axis=-1, passes=passes), expected)


def test_bad_arguments_raise_clear_errors():
    x = tf.ones([2, 3])
    with pytest.raises(ValueError, match="float64"):
        kth_largest(tf.ones([3], tf.float64), 1)
    with pytest.raises(ValueError, match="floating"):
        kth_largest(tf.ones([3], tf.int32), 1)
    with pytest.raises(ValueError, match="axis"):
        kth_largest(x, 1, axis=0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        kth_largest(x, 0)
    with pytest.raises(ValueError, match="bool"):
        kth_largest(x, 1, mask=tf.ones([2, 3]))
    with pytest.raises(ValueError, match="shape"):
        kth_largest(x, 1, mask=tf.ones([3, 2], tf.bool))
    with pytest.raises(ValueError, match="passes"):
        select_kth_largest(x, 1, passes=(4, 28))
    with pytest.raises(ValueError, match="k must be >= 1"):
        tf.function(lambda v: kth_largest(v, -2))(x)
