"""The speed paths of ``ce_retrieval.losses.kernels.fast_paths``, each against the plain computation it replaces, and
their second derivatives (nested ``tf.GradientTape``s) against the plain path's:

* radix selection (k-th largest, ties, masks, signed zeros, infinities, k edge cases) against a NumPy sort, and
  the top-k weights of negative mining against ``tf.math.top_k``;
* positive slots (``over_positive_slots``) against the losses' general paths (``positive_slots=0``) and a
  NumPy reference;
* the sorted merge (``count_below``) against the dense ``[N, M, M]`` hinge sum.
"""

import functools

import numpy as np
import pytest
import reference as ref
import tensorflow as tf

from ce_retrieval.losses import AngularLoss, StochasticNegativeMining, TripletLoss, relevance_from_ids
from ce_retrieval.losses.kernels.fast_paths import (
    count_below,
    key_to_float32,
    kth_largest,
    ordered_int32_key,
    over_positive_slots,
    select_kth_largest,
    top_k_weights,
)

P = functools.partial


def _value_and_grad(loss, r, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = loss(r, x)
    return value, tape.gradient(value, x)


def _hessian_vector_product(fn, x, v):
    """``(d/dx <grad fn(x), v>)``: a second derivative through nested tapes."""
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            value = fn(x)
        directional = tf.reduce_sum(inner.gradient(value, x) * v)
    return outer.gradient(directional, x)


# ---- radix selection -------------------------------------------------------------------------------------------


def sort_reference(values, k, mask):
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
        assert_matches(select_kth_largest(values, k, mask, axis=-1), sort_reference(values, k, mask))
        kg = int(rng.integers(1, values.size + 2))
        assert_matches(
            select_kth_largest(values, kg, mask), sort_reference(values.reshape(1, -1), [kg], mask.reshape(1, -1))
        )


def test_xla_matches_sort(rng):
    per_row = tf.function(lambda v, k, m: select_kth_largest(v, k, m, axis=-1), jit_compile=True)
    whole = tf.function(lambda v, k, m: select_kth_largest(v, k, m), jit_compile=True)
    for trial in range(6):
        values, k, mask = random_case(rng, trial, shape=(5, 24))  # one shape: one trace / compilation
        assert_matches(per_row(values, k.astype(np.int32), mask), sort_reference(values, k, mask))
        kg = np.int32(rng.integers(1, values.size + 2))
        assert_matches(whole(values, kg, mask), sort_reference(values.reshape(1, -1), [kg], mask.reshape(1, -1)))


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
    expected = sort_reference(values, [7] * 5, np.ones_like(values, bool))
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


def test_top_k_weights_match_tf_top_k(rng):
    """The mining weights (1 above the k-th largest, tied places shared, 0 below) against ``tf.math.top_k``: the
    weighted sum equals the sum of the top k values, per row and over the whole matrix."""
    for trial in range(6):
        values, _, mask = random_case(rng, trial + 1, shape=(5, 16))
        values = np.where(np.isfinite(values), values, 0.0).astype(np.float32)
        mask[:, 0] = True  # every row has a candidate
        masked = np.where(mask, values, -np.inf).astype(np.float32)
        count = mask.sum(axis=1, keepdims=True)
        k = np.maximum(count // 2, 1).astype(np.int32)
        weights = top_k_weights(tf.constant(masked), tf.constant(k), axis=-1).numpy()
        top = tf.math.top_k(masked, k=int(count.max())).values.numpy()
        for row in range(len(values)):
            want = top[row, : k[row, 0]].sum()
            np.testing.assert_allclose(np.sum(np.where(mask[row], weights[row] * values[row], 0.0)), want, rtol=1e-6)
            assert np.sum(weights[row]) == pytest.approx(k[row, 0])
        total_k = np.array([[max(int(mask.sum()) // 3, 1)]], np.int32)
        weights = top_k_weights(tf.constant(masked), tf.constant(total_k), axis=None).numpy()
        want = tf.math.top_k(masked.reshape(-1), k=int(total_k[0, 0])).values.numpy().sum()
        np.testing.assert_allclose(np.sum(np.where(mask, weights * values, 0.0)), want, rtol=1e-6)


def _mined_log_partition_plain(logits, negatives, k):
    """log of the sum of exp over the row's k largest negatives, by ``tf.math.top_k`` (the plain reference)."""
    masked = tf.where(negatives, logits, float("-inf"))
    top = tf.math.top_k(masked, k=k).values
    return tf.reduce_logsumexp(top, axis=1)


def test_mining_keeps_second_derivatives():
    """Stochastic negative mining (radix selection + top-k weights) has the Hessian of the plain top-k loss:
    the selected set is a constant of the differentiation either way."""
    rng = np.random.default_rng(3)
    relevance = np.zeros((5, 8), np.float32)
    relevance[np.arange(5), np.arange(5)] = 1.0
    s0 = tf.constant(rng.uniform(-0.9, 0.9, size=(5, 8)).astype(np.float32))
    loss = StochasticNegativeMining(scale=3.0, top_k=3)
    negatives = tf.constant(relevance == 0)

    def plain(s):  # mean over the positive pairs of softplus(logZ_topk - l_ii)
        log_z = _mined_log_partition_plain(3.0 * s, negatives, 3)
        return tf.reduce_mean(tf.math.softplus(log_z - 3.0 * tf.linalg.diag_part(s[:, :5])))

    v = tf.constant(rng.normal(size=(5, 8)).astype(np.float32))
    np.testing.assert_allclose(float(loss(relevance, s0)), float(plain(s0)), rtol=1e-6)
    fast = _hessian_vector_product(lambda s: loss(relevance, s), s0, v).numpy()
    want = _hessian_vector_product(plain, s0, v).numpy()
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(fast, want, rtol=1e-4, atol=1e-6)


# ---- positive slots ------------------------------------------------------------------------------------------


def uneven_batch(seed=12):
    """S = E E^T whose rows have 0, 1, 2, 3 or 6 positives (and ignored pairs): every slot count, the bound, the
    fallback."""
    ids = np.array([0] * 7 + [1] * 4 + [2] * 3 + [3] * 2 + [4, 5, 6])
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(ids.size, 5)) + 1.5 * rng.normal(size=(7, 5))[ids]
    e = (e / np.linalg.norm(e, axis=1, keepdims=True)).astype(np.float32)
    r = relevance_from_ids(ids, ids, exclude_self=True).numpy()
    r[1, 8] = r[9, 2] = -1.0  # an ignored pair in a couple of rows
    return (e @ e.T).astype(np.float32), r


@pytest.mark.slow
@pytest.mark.parametrize(
    "make, reference",
    [
        (lambda k: TripletLoss(positive_slots=k), ref.triplet),
        (
            lambda k: TripletLoss(distance="euclidean", average_nonzero=True, positive_slots=k),
            P(ref.triplet, distance="euclidean", average_nonzero=True),
        ),
        (
            lambda k: TripletLoss(mining="semi-hard", distance="cosine", positive_slots=k),
            P(ref.triplet, mining="semi-hard", distance="cosine"),
        ),
        (lambda k: AngularLoss(positive_slots=k), ref.angular),
        (lambda k: AngularLoss(with_npair=True, positive_slots=k), P(ref.angular, with_npair=True)),
    ],
    ids=["triplet_all", "triplet_all_nonzero", "triplet_semi_hard", "angular", "angular_npair"],
)
def test_positive_slots_and_general_path_agree(make, reference):
    """Per-slot evaluation (rows with <= positive_slots positives: 6 and 8), the fallback when a row has more
    (6 > 3) and the general path (0) give the reference value and the same gradient, eagerly and under XLA."""
    s, r = uneven_batch()
    want = reference(r, s.astype(np.float64))
    runs = {}
    for k in (0, 3, 6, 8):
        loss = make(k)
        runs[k] = [t.numpy() for t in _value_and_grad(loss, r, tf.constant(s))]
        np.testing.assert_allclose(runs[k][0], want, rtol=2e-5, err_msg=f"positive_slots={k}")
        np.testing.assert_allclose(runs[k][1], runs[0][1], rtol=1e-4, atol=1e-6, err_msg=f"positive_slots={k}")
    xla = tf.function(lambda x: _value_and_grad(make(6), r, x), jit_compile=True, autograph=False)(tf.constant(s))
    np.testing.assert_allclose(xla[0].numpy(), want, rtol=2e-5)
    np.testing.assert_allclose(xla[1].numpy(), runs[0][1], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_positive_slots_runs_the_smallest_bucket_and_carries_the_gradient():
    """The batch's largest positive count picks the branch: one positive per row runs one slot, five run the
    6-slot bucket, more than the bound runs the general path (counted by a variable that only the executed
    branch increments). Value and gradient of sum_{positive pairs} S^2 come out the same on every path."""
    calls = tf.Variable(0)

    @tf.function(autograph=False)
    def run(s, positive, bound):
        def make_slot(s):
            def slot(columns, valid):
                with tf.control_dependencies([calls.assign_add(1)]):
                    picked = tf.gather(s, columns[:, None], batch_dims=1)[:, 0]
                    return tf.reduce_sum(tf.where(valid, picked**2, 0.0)), (tf.reduce_sum(tf.cast(valid, tf.float32)),)

            return slot

        def general(s):
            return tf.reduce_sum(tf.where(positive, s**2, 0.0)), (tf.reduce_sum(tf.cast(positive, tf.float32)),)

        with tf.GradientTape() as tape:
            tape.watch(s)
            value, (count,) = over_positive_slots(s, positive, bound, make_slot, general)
        return value, count, tape.gradient(value, s)

    s = tf.constant(np.random.default_rng(0).uniform(-1, 1, size=(6, 6)).astype(np.float32))
    five = np.zeros((6, 6), bool)
    five[2, :5] = five[4, 1] = True
    for rows, bound, slots_run in [
        (np.eye(6, dtype=bool)[np.arange(6) ^ 1], 8, 1),
        (five, 8, 6),  # the smallest bucket covering 5 (SLOT_BUCKETS) is 6
        (five, 4, 0),
    ]:  # over the bound: the general path
        calls.assign(0)
        value, count, grad = run(s, tf.constant(rows), bound)
        assert int(calls.numpy()) == slots_run
        np.testing.assert_allclose(float(value), np.sum(np.where(rows, s.numpy() ** 2, 0.0)), rtol=1e-6)
        assert float(count) == rows.sum()
        np.testing.assert_allclose(grad.numpy(), np.where(rows, 2 * s.numpy(), 0.0), rtol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda k: TripletLoss(distance="euclidean", positive_slots=k),
        lambda k: TripletLoss(mining="semi-hard", distance="euclidean", positive_slots=k),
        lambda k: AngularLoss(with_npair=True, positive_slots=k),
    ],
    ids=["triplet_all", "triplet_semi_hard", "angular_npair"],
)
def test_positive_slots_keep_second_derivatives(make):
    """A nested-tape Hessian-vector product through the per-slot path (whose custom gradient is computed by
    differentiable ops) equals the general path's (positive_slots=0)."""
    s, r = uneven_batch()
    v = tf.constant(np.random.default_rng(1).normal(size=s.shape).astype(np.float32))
    s = tf.constant(s)
    general, slots = (_hessian_vector_product(lambda y, k=k: make(k)(r, y), s, v).numpy() for k in (0, 8))
    assert np.abs(general).max() > 1e-3
    np.testing.assert_allclose(slots, general, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "xla"])
def test_over_positive_slots_second_derivatives_in_graph_and_xla(mode):
    """The same in a graph and under XLA, on sum_{positive pairs} S^3 (Hessian 6 S on the positives), with a
    small slot bound (the losses' nine branches take minutes to differentiate twice at trace time)."""
    rng = np.random.default_rng(0)
    s = tf.constant(rng.uniform(-1, 1, size=(6, 6)).astype(np.float32))
    v = tf.constant(rng.normal(size=(6, 6)).astype(np.float32))
    rows = np.eye(6, dtype=bool)[np.arange(6) ^ 1]
    rows[0, 2] = True  # a row with two positives: two slots
    positive = tf.constant(rows)

    def cubic(bound):
        def make_slot(x):
            def slot(columns, valid):
                picked = tf.gather(x, columns[:, None], batch_dims=1)[:, 0]
                return tf.reduce_sum(tf.where(valid, picked**3, 0.0)), ()

            return slot

        def general(x):
            return tf.reduce_sum(tf.where(positive, x**3, 0.0)), ()

        return lambda x: over_positive_slots(x, positive, bound, make_slot, general)[0]

    hvp = tf.function(
        lambda x: [_hessian_vector_product(cubic(b), x, v) for b in (0, 3)], jit_compile=mode == "xla", autograph=False
    )
    general, slots = (h.numpy() for h in hvp(s))
    np.testing.assert_allclose(general, np.where(rows, 6 * s.numpy() * v.numpy(), 0.0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(slots, general, rtol=1e-5, atol=1e-6)


# ---- sorted merge ----------------------------------------------------------------------------------------------


def _dense_hinge_sums(thresholds, values, mask):
    """The plain reference of ``count_below``: the ``[N, M, M]`` comparison."""
    below = mask[:, None, :] & (values[:, None, :] < thresholds[:, :, None])
    count = tf.reduce_sum(tf.cast(below, tf.float32), axis=-1)
    total = tf.reduce_sum(tf.where(below, tf.broadcast_to(values[:, None, :], tf.shape(below)), 0.0), axis=-1)
    return count, total


def test_count_below_matches_the_dense_comparison_and_its_derivatives():
    rng = np.random.default_rng(4)
    values = tf.constant(np.round(rng.normal(size=(6, 9)) * 4).astype(np.float32) / 4)  # ties with thresholds
    thresholds = tf.constant(np.round(rng.normal(size=(6, 9)) * 4).astype(np.float32) / 4)
    mask = tf.constant(rng.random((6, 9)) < 0.7)
    count, total = count_below(thresholds, values, mask)
    want_count, want_total = _dense_hinge_sums(thresholds, values, mask)
    np.testing.assert_array_equal(count.numpy(), want_count.numpy())
    np.testing.assert_allclose(total.numpy(), want_total.numpy(), rtol=1e-6, atol=1e-6)
    inclusive, _ = count_below(thresholds, values, mask, inclusive=True)
    np.testing.assert_array_equal(
        inclusive.numpy(),
        tf.reduce_sum(
            tf.cast(mask[:, None, :] & (values[:, None, :] <= thresholds[:, :, None]), tf.float32), -1
        ).numpy(),
    )
    # sum of hinges count * t - total: first and second derivatives equal the dense sum's (in the values)
    smooth = tf.constant(rng.normal(size=(6, 9)).astype(np.float32))
    t = tf.constant(rng.normal(size=(6, 9)).astype(np.float32))
    v = tf.constant(rng.normal(size=(6, 9)).astype(np.float32))

    def fast(x):
        c, below = count_below(t, tf.sin(x), mask)
        return tf.reduce_sum(c * t - below)

    def dense(x):
        c, below = _dense_hinge_sums(t, tf.sin(x), mask)
        return tf.reduce_sum(c * t - below)

    np.testing.assert_allclose(float(fast(smooth)), float(dense(smooth)), rtol=1e-5)
    np.testing.assert_allclose(
        _hessian_vector_product(fast, smooth, v).numpy(),
        _hessian_vector_product(dense, smooth, v).numpy(),
        rtol=1e-4,
        atol=1e-6,
    )


def test_triplet_sorted_path_keeps_second_derivatives():
    """TripletLoss(positive_slots=0), the sorted merge, against a dense [N, M, M] TF transcription."""
    s, r = uneven_batch()
    positive, negative = tf.constant(r == 1), tf.constant(r == 0)
    v = tf.constant(np.random.default_rng(2).normal(size=s.shape).astype(np.float32))

    def dense(x):
        d = tf.sqrt(tf.maximum(2.0 - 2.0 * x, 1e-12))
        hinge = tf.nn.relu(0.2 + d[:, :, None] - d[:, None, :])  # [a, p, n]
        triplets = positive[:, :, None] & negative[:, None, :]
        per_pair = tf.reduce_sum(tf.where(triplets, hinge, 0.0), -1) / tf.maximum(
            tf.reduce_sum(tf.cast(negative, tf.float32), -1, keepdims=True), 1.0
        )
        kept = positive & tf.reduce_any(negative, -1, keepdims=True)
        return tf.reduce_sum(tf.where(kept, per_pair, 0.0)) / tf.reduce_sum(tf.cast(kept, tf.float32))

    loss = TripletLoss(distance="euclidean", positive_slots=0)
    x = tf.constant(s)
    np.testing.assert_allclose(float(loss(r, x)), float(dense(x)), rtol=1e-5)
    np.testing.assert_allclose(
        _hessian_vector_product(lambda y: loss(r, y), x, v).numpy(),
        _hessian_vector_product(dense, x, v).numpy(),
        rtol=1e-4,
        atol=1e-6,
    )
