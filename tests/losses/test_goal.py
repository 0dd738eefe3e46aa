"""GOAL gradient objectives (ce_retrieval/losses/goal.py, docs/goal.md).

* the prescribed W and the per-feature gradients vs an independent loop-based NumPy reference of goal.md's
  per-anchor formulas, for all 15 combinations and several y_true layouts;
* integrable combinations: W == autodiff gradient of the corresponding loss; non-integrable ones: the
  Jacobian of S -> W is not symmetric (so no loss has W as gradient), which is what the docs table claims;
* orientation invariance, value/gradient separation, errors (serialisation, XLA, mixed precision and bad inputs:
  ``test_contract.py``, as for every loss);
* Keras: all 15 trainable with model.fit under XLA, mixed precision, a 2-replica MirroredStrategy (subprocess);
* behaviour: circle x sigmoid-ms trains a two-tower model and improves recall@1.
"""

import itertools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from ce_retrieval.losses import GradientObjective, relevance_from_ids
from ce_retrieval.losses.goal import PAIR_WEIGHTS, TRIPLET_WEIGHTS, goal_gradient

COMBOS = list(itertools.product(TRIPLET_WEIGHTS, PAIR_WEIGHTS))
TAU, A, B, LAM, EPS = 10.0, 2.0, 10.0, 0.5, 0.1


# ---------------------------------------------------------------- independent reference (loops, float64)
def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def reference(x, y, s, r, tw, pw):
    """goal.md's per-anchor formulas, one anchor at a time. Returns value, W, dL/dX, dL/dY, MS set stats."""
    n_pairs = s.shape[0]
    p = np.diag(s)
    matched = [i for i in range(n_pairs) if r[i, i] == 1]
    p_min = min(p[i] for i in matched)
    w = np.zeros_like(s)
    dx, dy = np.zeros_like(x), np.zeros_like(y)
    value, stats = 0.0, []
    for image_anchor in (True, False):
        m, rel = (s, r) if image_anchor else (s.T, r.T)
        anchor_f, other_f = (x, y) if image_anchor else (y, x)
        d_anchor, d_other = (dx, dy) if image_anchor else (dy, dx)
        for i in matched:
            negs = [j for j in range(n_pairs) if j != i and rel[i, j] == 0]
            if not negs:
                continue
            k = max(negs, key=lambda j: m[i, j])  # first index of the maximum, as argmax
            n = m[i, k]
            if tw == "constant":
                t = 1.0
            elif tw == "nca":
                t = 1.0 / (1.0 + np.exp(TAU * (p[i] - n)))
            else:
                t = 1.0 / (1.0 + np.exp(TAU * (p[i] * (2 - p[i]) - n**2 - 0.5)))
            if pw == "constant":
                wp, wn = 1.0, 1.0
            elif pw == "linear":
                wp, wn = 1.0 - p[i], n
            elif pw == "sigmoid":
                wp, wn = 1.0 / (np.exp(A * (p[i] - LAM)) + 1), 1.0 / (np.exp(-B * (n - LAM)) + 1)
            else:
                pos_set = [j for j in matched if j != i and p[j] <= n + EPS]
                neg_set = [j for j in negs if j != k and m[i, j] >= p_min - EPS]
                stats.append((len(pos_set) / max(len(matched) - 1, 1), len(neg_set) / max(len(negs) - 1, 1)))
                if pw == "sigmoid-ms":
                    r_p = np.mean([np.exp(A * (p[i] - p[j])) for j in pos_set]) if pos_set else 0.0
                    r_n = np.mean([np.exp(-B * (n - m[i, j])) for j in neg_set]) if neg_set else 0.0
                    wp, wn = 1.0 / (np.exp(A * (p[i] - LAM)) + r_p), 1.0 / (np.exp(-B * (n - LAM)) + r_n)
                else:
                    r_p = np.mean([p[i] - p[j] for j in pos_set]) if pos_set else 0.0
                    r_n = np.mean([n - m[i, j] for j in neg_set]) if neg_set else 0.0
                    wp, wn = (1 - r_p) * (1 - p[i]), (1 + r_n) * n
            value += n - p[i]
            # goal.md: d/dx_i += t (wn y_a - wp y_i); d/dy_i -= t wp x_i; d/dy_a += t wn x_i (and symmetrically)
            d_anchor[i] += t * (wn * other_f[k] - wp * other_f[i])
            d_other[i] -= t * wp * anchor_f[i]
            d_other[k] += t * wn * anchor_f[i]
            if image_anchor:
                w[i, i] -= t * wp
                w[i, k] += t * wn
            else:
                w[i, i] -= t * wp
                w[k, i] += t * wn
    return value, w, dx, dy, np.array(stats)


def _features(n=9, dim=4, noise=0.9, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim))
    y = x + noise * rng.normal(size=(n, dim))  # correlated pairs: p spreads over (0, 1), sets are partial
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return x.astype(np.float32), y.astype(np.float32)


def _layout(kind, n=9, seed=0):
    rng = np.random.default_rng(seed + 7)
    if kind == "diagonal":
        return np.eye(n, dtype=np.float32)
    if kind == "duplicate_ids":  # 6 distinct ids for 9 pairs: duplicates are positives (1) off the diagonal
        ids = np.array([0, 1, 1, 2, 3, 3, 3, 4, 5])[:n]
        return relevance_from_ids(ids, ids).numpy()
    if kind == "duplicates_ignored":  # the same, duplicates marked -1 instead
        ids = np.array([0, 1, 1, 2, 3, 3, 3, 4, 5])[:n]
        r = relevance_from_ids(ids, ids).numpy()
        return np.where((r == 1) & ~np.eye(n, dtype=bool), -1.0, r).astype(np.float32)
    # "ignored": random ignored pairs, an anchor without pair, a row and a column without any negative
    r = np.where(rng.random((n, n)) < 0.25, -1.0, 0.0).astype(np.float32)
    np.fill_diagonal(r, 1.0)
    r[4, 4] = -1.0
    r[2, :] = -1.0
    r[2, 2] = 1.0
    r[:, 6] = -1.0
    r[6, 6] = 1.0
    return r


LAYOUTS = ["diagonal", "duplicate_ids", "duplicates_ignored", "ignored"]


def _tf_gradients(x, y, r, tw, pw, average=False):
    xt, yt = tf.constant(x), tf.constant(y)
    loss = GradientObjective(tw, pw, average_over_pairs=average)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([xt, yt])
        s = tf.matmul(xt, yt, transpose_b=True)
        value = loss(r, s)
    dx, dy, w = tape.gradient(value, [xt, yt, s])
    return float(value), w.numpy(), dx.numpy(), dy.numpy(), s.numpy()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tw,pw", COMBOS)
def test_gradient_matches_numpy_reference(tw, pw, layout):
    x, y = _features()
    r = _layout(layout)
    value, w, dx, dy, s = _tf_gradients(x, y, r, tw, pw)
    ref_value, ref_w, ref_dx, ref_dy, stats = reference(
        x.astype(np.float64), y.astype(np.float64), s.astype(np.float64), r, tw, pw
    )
    assert np.abs(ref_w).sum() > 0
    np.testing.assert_allclose(w, ref_w, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(dx, ref_dx, rtol=2e-5, atol=2e-6)  # dL/dX = W Y through ordinary autodiff
    np.testing.assert_allclose(dy, ref_dy, rtol=2e-5, atol=2e-6)  # dL/dY = W^T X
    assert value == pytest.approx(ref_value, rel=1e-5, abs=1e-6)
    if pw.endswith("-ms"):  # the data exercises partial MS sets (some members excluded, some kept)
        assert 0.0 < stats[:, 0].mean() < 1.0 and 0.0 < stats[:, 1].mean() < 1.0
        assert (stats[:, 0] == 0).any() or (stats[:, 1] < 1).any()


def test_average_over_pairs_divides_value_and_gradient_by_matched_pairs():
    x, y = _features()
    r = _layout("ignored")  # 8 matched pairs (anchor 4 has none)
    total = _tf_gradients(x, y, r, "circle", "sigmoid-ms", average=False)
    mean = _tf_gradients(x, y, r, "circle", "sigmoid-ms", average=True)
    assert mean[0] == pytest.approx(total[0] / 8, rel=1e-6)
    np.testing.assert_allclose(mean[1], total[1] / 8, rtol=1e-6)


# ---------------------------------------------------------------- integrable combinations
def _triplet_loss_sum(s, r, ell):
    """Sum over image and text anchors of ell(p, n) with hardest negatives mined by reduce_max (autodiff)."""
    p = tf.linalg.diag_part(s)
    matched = tf.linalg.diag_part(r) == 1
    negative = (r == 0) & ~tf.cast(tf.eye(s.shape[0]), tf.bool)
    masked = tf.where(negative, s, -1e9)
    total = 0.0
    for axis in (1, 0):
        ok = matched & tf.reduce_any(negative, axis=axis)
        n = tf.reduce_max(masked, axis=axis)
        total += tf.reduce_sum(tf.where(ok, ell(p, n), 0.0))
    return total


def _softplus(z):
    return tf.math.softplus(z)


INTEGRABLE = {
    ("constant", "constant"): lambda p, n: n - p,
    ("constant", "linear"): lambda p, n: 0.5 * ((1 - p) ** 2 + n**2),
    ("constant", "sigmoid"): lambda p, n: _softplus(-A * (p - LAM)) / A + _softplus(B * (n - LAM)) / B,
    ("nca", "constant"): lambda p, n: _softplus(TAU * (n - p)) / TAU,
    ("circle", "linear"): lambda p, n: _softplus(TAU * ((1 - p) ** 2 + n**2 - 0.5)) / (2 * TAU),
}


@pytest.mark.parametrize("layout", ["diagonal", "ignored"])
@pytest.mark.parametrize("combo", list(INTEGRABLE))
def test_prescribed_gradient_equals_autodiff_of_its_loss(combo, layout):
    x, y = _features(seed=3)
    r = tf.constant(_layout(layout))
    s = tf.constant(x @ y.T)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(s)
        prescribed = GradientObjective(*combo, average_over_pairs=False)(r, s)
        autodiff = _triplet_loss_sum(s, r, INTEGRABLE[combo])
    np.testing.assert_allclose(tape.gradient(prescribed, s), tape.gradient(autodiff, s), rtol=1e-5, atol=1e-6)
    if combo == ("constant", "constant"):  # there the value *is* the loss
        assert float(prescribed) == pytest.approx(float(autodiff), rel=1e-6)


def test_circle_linear_is_circle_loss_with_m_half():
    """Circle loss (Sun et al. 2020), alphas differentiated: softplus(g (a_n (n - D_n) - a_p (p - D_p)))."""
    m, gamma = 0.5, TAU
    p, n = tf.constant(0.63), tf.constant(0.41)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([p, n])
        circle = _softplus(gamma * ((n + m) * (n - m) - (1 + m - p) * (p - (1 - m))))
    t = 1.0 / (1.0 + np.exp(TAU * (0.63 * (2 - 0.63) - 0.41**2 - 0.5)))
    assert float(tape.gradient(circle, n)) / (2 * TAU) == pytest.approx(t * 0.41, rel=1e-5)
    assert float(tape.gradient(circle, p)) / (2 * TAU) == pytest.approx(-t * (1 - 0.63), rel=1e-5)


@pytest.mark.parametrize("tw,pw", COMBOS)
def test_integrability_matches_the_table(tw, pw):
    """W is a gradient field iff its Jacobian J = dW/dS is symmetric (locally, mining fixed): u^T J v = v^T J u.

    Checked along random directions (two backward passes each) instead of forming the full Jacobian.
    """
    x, y = _features(n=7, seed=5)
    s = tf.constant(x @ y.T)
    rng = np.random.default_rng(11)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(s)
        w = goal_gradient(tf.eye(7), s, tw, pw)[1]
    asymmetry = 0.0
    for _ in range(3):
        u, v = (tf.constant(rng.normal(size=(7, 7)), tf.float32) for _ in range(2))
        jt_u, jt_v = (tape.gradient(w, s, output_gradients=d, unconnected_gradients="zero") for d in (u, v))
        ujv, vju = float(tf.reduce_sum(v * jt_u)), float(tf.reduce_sum(u * jt_v))
        asymmetry = max(asymmetry, abs(ujv - vju) / (abs(ujv) + abs(vju) + 1e-12))
    if (tw, pw) in INTEGRABLE:
        assert asymmetry < 1e-4
    else:
        assert asymmetry > 1e-2


# ---------------------------------------------------------------- conventions
@pytest.mark.parametrize("tw,pw", [("circle", "sigmoid-ms"), ("nca", "linear-ms"), ("circle", "sigmoid")])
def test_orientation_does_not_matter(tw, pw):
    x, y = _features(seed=2)
    r = tf.constant(_layout("ignored"))
    s = tf.constant(x @ y.T)
    loss = GradientObjective(tw, pw)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(s)
        image_rows = loss(r, s)
        text_rows = loss(tf.transpose(r), tf.transpose(s))  # the two-tower model's S = Y X^T
    assert float(image_rows) == pytest.approx(float(text_rows), rel=1e-6)
    np.testing.assert_allclose(tape.gradient(image_rows, s), tape.gradient(text_rows, s), rtol=1e-6, atol=1e-7)


def test_value_is_logging_value_not_the_gradient_source():
    s = tf.constant([[0.9, 0.2, 0.5], [0.1, 0.8, 0.3], [0.4, 0.0, 0.7]])
    loss = GradientObjective("circle", "sigmoid", average_over_pairs=False)
    with tf.GradientTape() as tape:
        tape.watch(s)
        value = loss(tf.eye(3), s)
    # sum over rows of (row max off-diagonal - p) + same over columns
    expected = (0.5 - 0.9) + (0.3 - 0.8) + (0.4 - 0.7) + (0.4 - 0.9) + (0.2 - 0.8) + (0.5 - 0.7)
    assert float(value) == pytest.approx(expected, rel=1e-6)
    grad = tape.gradient(value, s).numpy()
    assert not np.allclose(grad[0, 0], -2.0)  # autodiff of the value would give -2 on the diagonal
    assert loss.name == "goal_value"


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="triplet_weight"):
        GradientObjective("hinge")
    with pytest.raises(ValueError, match="pair_weight"):
        GradientObjective("circle", "ms")
    with pytest.raises(ValueError, match="tau"):
        GradientObjective(tau=0.0)
    loss = GradientObjective()
    with pytest.raises(ValueError, match="square"):
        loss(tf.ones([2, 3]), tf.zeros([2, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="diagonal"):
        loss(tf.constant([[0.0, 1.0], [1.0, 0.0]]), tf.zeros([2, 2]))  # permuted pairs
    with pytest.raises(tf.errors.InvalidArgumentError, match="no matched pair"):
        loss(tf.constant([[-1.0, 1.0], [0.0, -1.0]]), tf.zeros([2, 2]))


# Every branch of the code (3 triplet weights, 5 pair weights) is hit by these five combinations; all 15 are
# trained under XLA by benchmarks/losses/goal_check.py (too many XLA compiles for the unit-test budget).
BRANCH_COVER = [
    ("constant", "constant"),
    ("nca", "sigmoid"),
    ("circle", "linear"),
    ("nca", "linear-ms"),
    ("circle", "sigmoid-ms"),
]


def test_jit_matches_eager():
    """In one XLA cluster (one compile), against eager execution, the branch-covering objectives that the
    model.fit tests below do not already compile (those fit nca x linear-ms and circle x sigmoid-ms)."""
    x, y = _features(n=8, seed=4)
    s = tf.constant(x @ y.T)
    r = tf.constant(_layout("duplicate_ids", n=8))
    losses = [GradientObjective(tw, pw) for tw, pw in BRANCH_COVER[:3]]

    def values_and_grads(s_):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(s_)
            values = [loss(r, s_) for loss in losses]
        return tf.stack(values), tf.stack([tape.gradient(v, s_) for v in values])

    eager = values_and_grads(s)
    jit = tf.function(values_and_grads, jit_compile=True)(s)
    np.testing.assert_allclose(jit[0], eager[0], rtol=1e-5)
    np.testing.assert_allclose(jit[1], eager[1], rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- two-tower model and Keras
def _two_tower(d_image=6, d_text=5, dim=4, text_rows=False):
    """Two Dense towers, L2-normalised; output S = X Y^T (goal.md) or S = Y X^T (the two-tower convention)."""
    images, texts = tf_keras.Input((d_image,)), tf_keras.Input((d_text,))
    normalise = tf_keras.layers.Lambda(lambda t: tf.math.l2_normalize(t, axis=1))
    x = normalise(tf_keras.layers.Dense(dim, use_bias=False, name="image_tower")(images))
    y = normalise(tf_keras.layers.Dense(dim, use_bias=False, name="text_tower")(texts))
    pair = [y, x] if text_rows else [x, y]
    s = tf_keras.layers.Lambda(lambda t: tf.matmul(t[0], t[1], transpose_b=True))(pair)
    return tf_keras.Model([images, texts], s), tf_keras.Model([images, texts], [x, y])


def _paired_data(n, d_image=6, d_text=5, latent=4, noise=0.1, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, latent))
    mix_image, mix_text = rng.normal(size=(latent, d_image)), rng.normal(size=(latent, d_text))
    images = z @ mix_image + noise * rng.normal(size=(n, d_image))
    texts = z @ mix_text + noise * rng.normal(size=(n, d_text))
    return images.astype(np.float32), texts.astype(np.float32)


def _dataset(images, texts, batch):
    ds = tf.data.Dataset.from_tensor_slices((images, texts)).batch(batch, drop_remainder=True)
    return ds.map(lambda a, b: ((a, b), tf.eye(tf.shape(a)[0])))


@pytest.mark.parametrize("text_rows", [False, True])
def test_gradient_reaches_both_towers(text_rows):
    """dL/dX = W Y and dL/dY = W^T X (goal.md's per-feature formulas), then into both towers' kernels."""
    model, embed = _two_tower(text_rows=text_rows)
    images, texts = _paired_data(7, seed=1)
    loss = GradientObjective("circle", "sigmoid-ms", average_over_pairs=False)
    with tf.GradientTape(persistent=True) as tape:
        x, y = embed([images, texts])
        s = tf.matmul(y, x, transpose_b=True) if text_rows else tf.matmul(x, y, transpose_b=True)
        value = loss(tf.eye(7), s)
    dx, dy = tape.gradient(value, [x, y])
    x64, y64 = x.numpy().astype(np.float64), y.numpy().astype(np.float64)
    _, w, ref_dx, ref_dy, _ = reference(x64, y64, x64 @ y64.T, np.eye(7), "circle", "sigmoid-ms")
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dy, ref_dy, rtol=1e-4, atol=1e-5)
    grads = tape.gradient(value, embed.trainable_variables)
    assert len(grads) == 2 and all(float(tf.norm(g)) > 0 for g in grads)
    # the towers receive exactly the gradient of the surrogate <W, S> with W held constant
    with tf.GradientTape() as surrogate_tape:
        x, y = embed([images, texts])
        surrogate = tf.reduce_sum(tf.constant(w, tf.float32) * tf.matmul(x, y, transpose_b=True))
    expected = surrogate_tape.gradient(surrogate, embed.trainable_variables)
    for g, e in zip(grads, expected, strict=True):
        # float32 kernel gradients are sums of O(10) terms: elementwise agreement is relative to that scale
        # (a -0.0125 entry made of +-10 terms differs at 2e-6 across CPU instruction sets).
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5 * float(np.abs(e).max()))


def test_model_fit_under_xla():
    """model.fit with jit_compile=True (circle x sigmoid-ms is also fitted under XLA in mixed precision below)."""
    model, _ = _two_tower()
    images, texts = _paired_data(32, seed=2)
    model.compile(tf_keras.optimizers.SGD(0.5), loss=GradientObjective("nca", "linear-ms"), jit_compile=True)
    before = [v.numpy().copy() for v in model.trainable_variables]
    history = model.fit(_dataset(images, texts, 8), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert all(not np.allclose(b, v.numpy()) for b, v in zip(before, model.trainable_variables, strict=True))


def test_mixed_precision_matches_float32():
    images, texts = _paired_data(8, seed=3)
    loss = GradientObjective("circle", "sigmoid-ms")
    grads = []
    for policy in ("float32", "mixed_float16"):
        tf_keras.mixed_precision.set_global_policy(policy)
        tf_keras.utils.set_random_seed(0)
        model, _ = _two_tower()
        with tf.GradientTape() as tape:
            value = loss(tf.eye(8), model([images, texts]))
        assert value.dtype == tf.float32
        grads.append(tape.gradient(value, model.trainable_variables))
    for g32, g16 in zip(*grads, strict=True):
        np.testing.assert_allclose(tf.cast(g16, tf.float32), g32, rtol=0.05, atol=5e-3)
    # and model.fit under XLA with a loss-scaled optimizer (the custom gradient follows the loss scale)
    model.compile(tf_keras.optimizers.SGD(0.5), loss=loss, jit_compile=True)
    assert isinstance(model.optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    history = model.fit(_dataset(*_paired_data(32, seed=4), 8), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


_DISTRIBUTED = textwrap.dedent(
    """
    import json, os
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import ce_retrieval
    import tensorflow as tf
    import tf_keras
    from ce_retrieval.losses import GradientObjective
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    images, texts = rng.normal(size=(8, 6)).astype("float32"), rng.normal(size=(8, 5)).astype("float32")
    loss = GradientObjective("circle", "sigmoid-ms")
    summed = GradientObjective("circle", "sigmoid-ms", reduction="sum")
    with strategy.scope():
        towers = [tf_keras.layers.Dense(4, use_bias=False) for _ in range(2)]
        towers[0].build((None, 6)); towers[1].build((None, 5))
    variables = [t.kernel for t in towers]

    def embed(a, b):
        return (tf.math.l2_normalize(towers[0](a), axis=1), tf.math.l2_normalize(towers[1](b), axis=1))

    with tf.GradientTape() as tape:  # single device, whole batch
        x, y = embed(images, texts)
        single_value = loss(tf.eye(8), tf.matmul(x, y, transpose_b=True))
    single = tape.gradient(single_value, variables)

    @tf.function
    def replica_step(a, b):
        ctx = tf.distribute.get_replica_context()
        with tf.GradientTape() as tape:
            x, y = embed(a, b)
            x, y = ctx.all_gather(x, axis=0), ctx.all_gather(y, axis=0)  # the global [8, 8] matrix
            # a custom loop scales for replicas itself (reduction="sum": Keras leaves the value alone)
            value = summed(tf.eye(8), tf.matmul(x, y, transpose_b=True)) / ctx.num_replicas_in_sync
        return value, tape.gradient(value, variables)

    shards = strategy.experimental_distribute_values_from_function(
        lambda ctx: (images[4 * ctx.replica_id_in_sync_group:][:4], texts[4 * ctx.replica_id_in_sync_group:][:4]))
    value, grads = strategy.run(replica_step, args=shards)
    value = strategy.reduce("SUM", value, axis=None)
    grads = [strategy.reduce("SUM", g, axis=None) for g in grads]
    with strategy.scope():  # and model.fit on per-replica (local) similarity matrices
        a, b = tf_keras.Input((6,)), tf_keras.Input((5,))
        x = tf.math.l2_normalize(tf_keras.layers.Dense(4)(a), axis=1)
        y = tf.math.l2_normalize(tf_keras.layers.Dense(4)(b), axis=1)
        model = tf_keras.Model([a, b], tf.matmul(y, x, transpose_b=True))
        model.compile(tf_keras.optimizers.SGD(0.1), loss=GradientObjective("nca", "sigmoid"))
    # the global batch of 8 is split 4 + 4 along rows: y_true [8, 4] gives each replica its own identity
    data = tf.data.Dataset.from_tensor_slices((images, texts)).batch(8, drop_remainder=True)
    data = data.map(lambda a, b: ((a, b), tf.tile(tf.eye(4), [2, 1])))
    fit_loss = model.fit(data.repeat(2), epochs=1, verbose=0)
    print(json.dumps({
        "fit_loss": fit_loss.history["loss"],
        "replicas": strategy.num_replicas_in_sync,
        "value": [float(single_value), float(value)],
        "grad_error": max(float(tf.reduce_max(tf.abs(g - s))) for g, s in zip(grads, single)),
        "grad_norm": min(float(tf.norm(s)) for s in single),
        "grad_scale": max(float(tf.reduce_max(tf.abs(s))) for s in single),
    }))
    """
)


@pytest.mark.slow
def test_distributed_gradient_equals_single_device():
    """2 replicas, all_gather'ed global S: summed replica gradients == single-device gradient (custom grad scaled)."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _DISTRIBUTED], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert result["value"][1] == pytest.approx(result["value"][0], rel=1e-5)
    # float32: the replicas' partial gradients are summed in another order than one device's (CI saw 1.2e-5 on
    # entries of size ~2; 5e-7 here), so the bound is relative to the largest entry; a real error (a replica
    # scaling off by 2, a lost term) is O(1) relative
    assert result["grad_norm"] > 0 and result["grad_error"] < 5e-5 * max(result["grad_scale"], 1.0)
    assert np.isfinite(result["fit_loss"]).all()


def _recall_at_1(embed, images, texts):
    x, y = embed([images, texts])
    return float(np.mean(np.argmax(tf.matmul(x, y, transpose_b=True), axis=1) == np.arange(len(images))))


@pytest.mark.slow
def test_circle_sigmoid_ms_training_improves_recall():
    images, texts = _paired_data(640, d_image=16, d_text=12, latent=8, noise=0.2, seed=5)
    model, embed = _two_tower(d_image=16, d_text=12, dim=16)
    before = _recall_at_1(embed, images[512:], texts[512:])
    model.compile(tf_keras.optimizers.Adam(0.01), loss=GradientObjective("circle", "sigmoid-ms"))
    model.fit(_dataset(images[:512], texts[:512], 32).repeat(), steps_per_epoch=100, epochs=1, verbose=0)
    after = _recall_at_1(embed, images[512:], texts[512:])
    print(f"recall@1 {before:.3f} -> {after:.3f}")
    assert after > before + 0.4, (before, after)
