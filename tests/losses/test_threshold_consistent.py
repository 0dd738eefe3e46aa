"""Threshold-Consistent Margin (``ce_retrieval/losses/threshold_consistent.py``): values against the float64 loop
reference (``reference.threshold_consistent_margin``), gradients in closed form and by finite differences, the
empty sides, pytorch-metric-learning's ``ThresholdConsistentMarginLoss`` (value and gradient), XLA and half
precision. The registry-wide contract is in ``test_contract.py``."""

import numpy as np
import pytest
import reference as ref
import tensorflow as tf
import torch
from pytorch_metric_learning import losses as pml_losses

from ce_retrieval.losses import ThresholdConsistentMargin, relevance_from_ids
from ce_retrieval.losses import functional as F


def batch(seed=0, n=7, m=9):
    """Cosines spread over both margins, several positives in some rows, ignored pairs."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(-0.2, 1.0, size=(n, m)).astype(np.float32)
    r = rng.choice([-1.0, 0.0, 0.0, 1.0], size=(n, m)).astype(np.float32)
    r[np.arange(n), rng.integers(0, m, n)] = 1.0
    return s, r


@pytest.mark.parametrize(
    "kwargs",
    [{}, dict(margin_plus=0.7, margin_minus=0.3, weight_plus=0.5, weight_minus=2.0)],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_value_matches_float64_reference(kwargs, seed):
    s, r = batch(seed)
    assert (r == -1).any() and (r == 1).sum(axis=1).max() >= 2
    got = float(ThresholdConsistentMargin(**kwargs)(r, s))
    want = ref.threshold_consistent_margin(r, s.astype(np.float64), **kwargs)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert float(F.threshold_consistent_margin(r, s, **kwargs)) == pytest.approx(got, rel=1e-7)


def test_ignored_pairs_and_sides_without_violations():
    r = np.array([[1.0, 0.0, -1.0], [0.0, 1.0, 0.0]], np.float32)
    s = np.array([[0.95, 0.1, 0.99], [0.4, 0.92, -0.3]], np.float32)  # every pair on its right side
    assert float(ThresholdConsistentMargin()(r, s)) == 0.0  # the ignored 0.99 is no violating negative
    s[0, 0] = 0.5  # one positive 0.4 below m⁺; one negative 0.3 above m⁻
    s[1, 0] = 0.8
    assert float(ThresholdConsistentMargin()(r, s)) == pytest.approx(0.4 + 0.3, rel=1e-6)


def test_gradient_closed_form_and_finite_differences():
    """dL/ds = -λ⁺/n⁺ on violating positives, +λ⁻/n⁻ on violating negatives, 0 elsewhere."""
    s, r = batch(3)
    kwargs = dict(margin_plus=0.8, margin_minus=0.4, weight_plus=0.7, weight_minus=1.5)
    st = tf.constant(s)
    with tf.GradientTape() as tape:
        tape.watch(st)
        value = ThresholdConsistentMargin(**kwargs)(r, st)
    grad = tape.gradient(value, st).numpy().astype(np.float64)
    too_far = (r == 1) & (s <= 0.8)
    too_close = (r == 0) & (s >= 0.4)
    closed = np.zeros_like(grad)
    closed[too_far] = -0.7 / too_far.sum()
    closed[too_close] = 1.5 / too_close.sum()
    np.testing.assert_allclose(grad, closed, rtol=1e-6, atol=1e-9)
    # Finite differences of the reference: steps small enough that no pair crosses a margin
    s64, rng = s.astype(np.float64), np.random.default_rng(0)
    gap = min(np.abs(s64 - 0.8).min(), np.abs(s64 - 0.4).min())
    eps = 0.25 * gap
    for _ in range(3):
        v = rng.uniform(-1, 1, size=s.shape)
        up = ref.threshold_consistent_margin(r, s64 + eps * v, **kwargs)
        down = ref.threshold_consistent_margin(r, s64 - eps * v, **kwargs)
        np.testing.assert_allclose(np.sum(grad * v), (up - down) / (2 * eps), rtol=1e-6)


@pytest.mark.parametrize("margins", [(0.9, 0.5), (0.6, 0.1)])
def test_matches_pytorch_metric_learning(margins):
    """Same embeddings and labels: pml's loss on every pair of the batch equals ours on S = E Eᵀ with self-pairs
    ignored (pml counts (a, b) and (b, a); the means are unchanged); gradients tangent to the sphere agree."""
    rng = np.random.default_rng(11)
    ids = np.repeat(np.arange(5), 4)
    centres = rng.normal(size=(5, 8))
    e = centres[ids] + 0.9 * rng.normal(size=(20, 8))
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    m_plus, m_minus = margins
    theirs = pml_losses.ThresholdConsistentMarginLoss(margin_plus=m_plus, margin_minus=m_minus)
    emb = torch.tensor(e, dtype=torch.float64, requires_grad=True)
    value = theirs(emb, torch.tensor(ids))
    value.backward()
    et = tf.constant(e, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(et)
        unit = tf.math.l2_normalize(et, axis=1)
        gram = tf.matmul(unit, unit, transpose_b=True)
        mine = ThresholdConsistentMargin(margin_plus=m_plus, margin_minus=m_minus)(
            relevance_from_ids(ids, ids, exclude_self=True), gram
        )
    assert value.item() > 0  # both sides have violating pairs here: the comparison is not 0 == 0
    np.testing.assert_allclose(float(mine), value.item(), rtol=1e-5)
    tangent = lambda g: g - np.sum(g * e, axis=1, keepdims=True) * e  # noqa: E731
    np.testing.assert_allclose(tangent(tape.gradient(mine, et).numpy()), tangent(emb.grad.numpy()), atol=1e-6)


def test_xla_and_half_precision():
    s, r = batch(4)
    loss = ThresholdConsistentMargin()

    def value_and_grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            v = loss(r, x)
        return v, tape.gradient(v, x)

    eager = value_and_grad(tf.constant(s))
    xla = tf.function(value_and_grad, jit_compile=True)(tf.constant(s))
    np.testing.assert_allclose(float(xla[0]), float(eager[0]), rtol=1e-6)
    np.testing.assert_allclose(xla[1].numpy(), eager[1].numpy(), rtol=1e-6)
    for dtype in (tf.float16, tf.bfloat16):
        low = tf.cast(s, dtype)
        value, grad = value_and_grad(low)
        assert value.dtype == tf.float32 and grad.dtype == dtype
        want = ref.threshold_consistent_margin(r, tf.cast(low, tf.float64).numpy())
        np.testing.assert_allclose(float(value), want, rtol=1e-5)


def test_hyperparameters_are_checked():
    with pytest.raises(ValueError, match=r"margins are cosines in \[-1, 1\]"):
        ThresholdConsistentMargin(margin_plus=20.0)
    with pytest.raises(ValueError, match="weight_plus and weight_minus must be >= 0"):
        ThresholdConsistentMargin(weight_minus=-1.0)
    with pytest.raises(ValueError, match="bidirectional"):
        ThresholdConsistentMargin(bidirectional=True)
