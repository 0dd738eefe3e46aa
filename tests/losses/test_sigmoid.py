"""SigLIP's pairwise sigmoid loss (``ce_retrieval/losses/sigmoid.py``): values against the float64 loop reference
(``reference.sigmoid``) and the paper's Algorithm 1, gradients in closed form and by finite differences, stability
at extreme logits, XLA and half precision, the Keras 3 twin. The registry-wide contract (config, names, errors,
functional API) is in ``test_contract.py``."""

import keras
import numpy as np
import pytest
import reference as ref
import tensorflow as tf

from ce_retrieval import losses
from ce_retrieval.keras import losses as keras3_losses
from ce_retrieval.losses import SigmoidLoss
from ce_retrieval.losses import functional as F


def batch(seed=0, n=6, m=9):
    """Rectangular scores with several positives in some rows, ignored pairs, and a row of negatives only."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(-0.9, 0.95, size=(n, m)).astype(np.float32)
    r = rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0], size=(n, m)).astype(np.float32)
    r[np.arange(n), rng.integers(0, m, n)] = 1.0
    r[0, :3] = 1.0  # three positives in row 0
    r[1] = np.where(r[1] == 1.0, 0.0, r[1])  # row 1: no positive
    return s, r


@pytest.mark.parametrize("scale, bias", [(10.0, -10.0), (1.0, 0.0), (3.5, 2.0)])
@pytest.mark.parametrize("seed", [0, 1])
def test_value_matches_float64_reference(scale, bias, seed):
    s, r = batch(seed)
    assert (r == -1).any() and (r == 1).sum(axis=1).max() >= 3
    got = float(SigmoidLoss(scale=scale, bias=bias)(r, s))
    want = ref.sigmoid(r, s.astype(np.float64), scale, bias)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert float(F.sigmoid_loss(r, s, scale=scale, bias=bias)) == pytest.approx(got, rel=1e-7)


def test_identity_relevance_is_the_papers_algorithm_1():
    """Zhai et al. (2023), Algorithm 1: ``labels = 2 eye(n) - ones(n); l = -sum(log_sigmoid(labels * logits)) / n``."""
    rng = np.random.default_rng(3)
    img, txt = rng.normal(size=(8, 5)), rng.normal(size=(8, 5))
    img /= np.linalg.norm(img, axis=1, keepdims=True)
    txt /= np.linalg.norm(txt, axis=1, keepdims=True)
    t, b = np.exp(np.log(10.0)), -10.0
    logits = img @ txt.T * t + b
    labels = 2 * np.eye(8) - np.ones(8)
    paper = -np.sum(-np.logaddexp(0.0, -labels * logits)) / 8
    ours = float(SigmoidLoss(scale=t, bias=b)(np.eye(8, dtype=np.float32), (img @ txt.T).astype(np.float32)))
    np.testing.assert_allclose(ours, paper, rtol=1e-6)


def test_ignored_pairs_enter_no_term_and_normalisation_is_per_row():
    s, r = batch(2)
    loss = SigmoidLoss(scale=4.0, bias=-1.0)
    moved = s.copy()
    moved[r == -1] = -s[r == -1] + 0.3  # change every ignored score: the value must not move
    assert float(loss(r, moved)) == pytest.approx(float(loss(r, s)), rel=1e-7)
    # Dividing by N, not by the number of pairs: duplicating the columns doubles the value.
    np.testing.assert_allclose(float(loss(np.hstack([r, r]), np.hstack([s, s]))), 2 * float(loss(r, s)), rtol=1e-6)


def test_gradient_closed_form_and_finite_differences():
    """dL/ds_ij = -z_ij t σ(-z_ij (t s_ij + b)) / N on counted pairs, 0 on ignored ones."""
    s, r = batch(4)
    scale, bias = 5.0, -3.0
    st = tf.constant(s)
    with tf.GradientTape() as tape:
        tape.watch(st)
        value = SigmoidLoss(scale=scale, bias=bias)(r, st)
    grad = tape.gradient(value, st).numpy().astype(np.float64)
    s64 = s.astype(np.float64)
    z = np.where(r == 1, 1.0, -1.0)
    closed = -z * scale / (1.0 + np.exp(z * (scale * s64 + bias))) / s.shape[0]
    closed[r == -1] = 0.0
    np.testing.assert_allclose(grad, closed, rtol=1e-5, atol=1e-7)
    rng = np.random.default_rng(0)
    for _ in range(3):
        v = rng.normal(size=s.shape)
        eps = 1e-6
        fd = (ref.sigmoid(r, s64 + eps * v, scale, bias) - ref.sigmoid(r, s64 - eps * v, scale, bias)) / (2 * eps)
        np.testing.assert_allclose(np.sum(grad * v), fd, rtol=1e-4)


def test_extreme_logits_are_finite_and_exact():
    """softplus, not log(sigmoid): a logit of ±1000 gives 0 or 1000 per pair, never inf or NaN."""
    r = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    s = np.array([[-1.0, 1.0], [1.0, 1.0]], np.float32)
    scale = 1000.0
    st = tf.constant(s)
    with tf.GradientTape() as tape:
        tape.watch(st)
        value = SigmoidLoss(scale=scale, bias=0.0)(r, st)
    # row 0: positive at -1000 (1000) + negative at +1000 (1000); row 1: negative at +1000 (1000) + positive (0)
    assert float(value) == pytest.approx(3000.0 / 2, rel=1e-6)
    assert np.all(np.isfinite(tape.gradient(value, st).numpy()))


def test_xla_and_half_precision():
    s, r = batch(5)
    loss = SigmoidLoss(scale=10.0, bias=-10.0)

    def value_and_grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            v = loss(r, x)
        return v, tape.gradient(v, x)

    eager = value_and_grad(tf.constant(s))
    xla = tf.function(value_and_grad, jit_compile=True)(tf.constant(s))
    np.testing.assert_allclose(float(xla[0]), float(eager[0]), rtol=1e-6)
    np.testing.assert_allclose(xla[1].numpy(), eager[1].numpy(), rtol=1e-5, atol=1e-8)
    for dtype in (tf.float16, tf.bfloat16):
        low = tf.cast(s, dtype)
        value, grad = value_and_grad(low)
        assert value.dtype == tf.float32 and grad.dtype == dtype
        want = ref.sigmoid(r, tf.cast(low, tf.float64).numpy(), 10.0, -10.0)  # the rounded scores, in float64
        np.testing.assert_allclose(float(value), want, rtol=1e-5)


def test_declared_capabilities():
    assert SigmoidLoss.has_logit_scale and SigmoidLoss.has_logit_bias and not SigmoidLoss.supports_bidirectional
    loss = SigmoidLoss(**SigmoidLoss.logit_scale_kwargs(7.0), **SigmoidLoss.logit_bias_kwargs(-4.0))
    assert (loss.logit_scale, loss.logit_bias) == (7.0, -4.0)
    assert losses.lookup("sigmoid_loss") is SigmoidLoss and losses.get("SigmoidLoss").get_config() == {
        "name": "sigmoid_loss",
        "scale": 10.0,
        "bias": -10.0,
    }
    assert losses.CrossExampleSoftmax().logit_bias is None and losses.CrossExampleSoftmax.logit_bias_kwargs(1.0) == {}


def test_hyperparameters_are_checked():
    with pytest.raises(ValueError, match="scale .* must be a positive"):
        SigmoidLoss(scale=0.0)
    with pytest.raises(ValueError, match="bias must be a finite number"):
        SigmoidLoss(bias=float("nan"))
    with pytest.raises(ValueError, match="bidirectional"):
        SigmoidLoss(bidirectional=True)


def test_keras3_twin_computes_the_same_value():
    s, r = batch(6)
    twin = keras3_losses.get("sigmoid_loss", scale=4.0, bias=-2.0)
    assert isinstance(twin, keras.losses.Loss) and type(twin).__name__ == "SigmoidLoss"
    assert type(twin).has_logit_bias and not type(twin).supports_bidirectional
    np.testing.assert_allclose(float(twin(r, s)), ref.sigmoid(r, s.astype(np.float64), 4.0, -2.0), rtol=1e-6)
    clone = keras.losses.deserialize(keras.losses.serialize(twin))
    assert type(clone) is type(twin) and clone.get_config() == twin.get_config()
