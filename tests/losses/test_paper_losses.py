"""The paper's four objectives (eqs. 2, 3, 5, 6) against an independent float64 NumPy reference
(``reference.softmax``). Serialisation, mixed precision, XLA and bad inputs of every loss: ``test_contract.py``."""

import math

import numpy as np
import pytest
import tensorflow as tf
from reference import softmax as reference_loss

from ce_retrieval.losses import (
    CrossExampleNegativeMining,
    CrossExampleSoftmax,
    SampledSoftmax,
    StochasticNegativeMining,
    functional,
)

CASES = [
    (SampledSoftmax, {}, dict(cross_example=False)),
    (StochasticNegativeMining, {}, dict(cross_example=False, fraction=0.5)),
    (StochasticNegativeMining, dict(negative_fraction=0.3), dict(cross_example=False, fraction=0.3)),
    (StochasticNegativeMining, dict(top_k=3), dict(cross_example=False, top_k=3)),
    (CrossExampleSoftmax, {}, dict(cross_example=True)),
    (CrossExampleNegativeMining, {}, dict(cross_example=True, fraction=0.5)),
    (CrossExampleNegativeMining, dict(negative_fraction=0.15), dict(cross_example=True, fraction=0.15)),
    (CrossExampleNegativeMining, dict(top_k=10_000), dict(cross_example=True, top_k=10_000)),
]
IDS = [f"{cls.__name__}-{kwargs}" for cls, kwargs, _ in CASES]


def make_batch(rng, n=7, m=11, ties=False):
    """Cosine-like scores with several positives per row, ignored pairs, a row without negatives."""
    scores = rng.uniform(-1, 1, size=(n, m))
    if ties:
        scores = np.round(scores * 4) / 4  # exact ties everywhere
    relevance = (rng.random((n, m)) < 0.25).astype(np.float32)
    relevance[rng.random((n, m)) < 0.15] = -1
    relevance[np.arange(n), np.arange(n) % m] = 1
    relevance[0] = -1
    relevance[0, 0] = 1  # row 0: one positive, no negatives
    relevance[1, :3] = 1  # row 1: several positives
    return relevance, scores.astype(np.float32)


@pytest.mark.parametrize("cls,kwargs,ref", CASES, ids=IDS)
def test_matches_reference(rng, cls, kwargs, ref):
    loss = cls(**kwargs)
    for ties in (False, True):
        for shape in [(7, 11), (9, 4)]:
            relevance, scores = make_batch(rng, *shape, ties=ties)
            np.testing.assert_allclose(
                float(loss(relevance, scores)), reference_loss(relevance, scores, **ref), rtol=2e-6
            )


@pytest.mark.parametrize("cls", [StochasticNegativeMining, CrossExampleNegativeMining])
def test_xla_equals_eager_with_tied_negatives(rng, cls):
    relevance, scores = make_batch(rng, ties=True)
    loss = cls()
    compiled = tf.function(loss, jit_compile=True)
    assert float(compiled(relevance, scores)) == pytest.approx(float(loss(relevance, scores)), rel=1e-6)


@pytest.mark.parametrize("cls,kwargs,ref", CASES[:2] + CASES[4:6], ids=IDS[:2] + IDS[4:6])
def test_gradient_matches_finite_differences_of_reference(rng, cls, kwargs, ref):
    relevance, scores = make_batch(rng, n=5, m=6)
    scores = scores * 0.2  # moderate logits so that float32 autodiff vs float64 differences is tight
    s = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(s)
        value = cls(**kwargs)(relevance, s)
    grad = tape.gradient(value, s).numpy()
    eps = 1e-6
    numeric = np.zeros_like(scores, np.float64)
    base = scores.astype(np.float64)
    for idx in np.ndindex(*scores.shape):
        up, down = base.copy(), base.copy()
        up[idx] += eps
        down[idx] -= eps
        numeric[idx] = (reference_loss(relevance, up, **ref) - reference_loss(relevance, down, **ref)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, atol=2e-5)
    assert np.all(grad[relevance == -1] == 0)  # ignored pairs appear nowhere


def test_mined_gradient_splits_evenly_among_ties():
    # Row negatives [1, 1, 1, 0], k = ceil(0.5 * 4) = 2: two of three tied entries are kept.
    relevance = np.array([[1, 0, 0, 0, 0]], np.float32)
    s = tf.constant([[0.5, 0.1, 0.1, 0.1, 0.0]])
    with tf.GradientTape() as tape:
        tape.watch(s)
        value = StochasticNegativeMining(scale=1.0)(relevance, s)
    np.testing.assert_allclose(float(value), -0.5 + np.log(np.exp(0.5) + 2 * np.exp(0.1)), rtol=1e-6)
    grad = tape.gradient(value, s).numpy()[0]
    np.testing.assert_allclose(grad[1:4], np.full(3, 2 / 3 * np.exp(0.1) / (np.exp(0.5) + 2 * np.exp(0.1))), rtol=1e-5)
    assert grad[4] == 0.0


def test_properties(rng):
    relevance, scores = make_batch(rng)
    ss, ce = float(SampledSoftmax()(relevance, scores)), float(CrossExampleSoftmax()(relevance, scores))
    assert ce >= ss  # Neg_i is a subset of Neg
    assert float(StochasticNegativeMining(negative_fraction=1.0)(relevance, scores)) == pytest.approx(ss, rel=1e-6)
    assert float(CrossExampleNegativeMining(negative_fraction=1.0)(relevance, scores)) == pytest.approx(ce, rel=1e-6)
    assert float(StochasticNegativeMining()(relevance, scores)) <= ss + 1e-6  # fewer negatives, smaller Z
    row_r, row_s = relevance[1:2], scores[1:2]
    assert float(CrossExampleSoftmax()(row_r, row_s)) == pytest.approx(float(SampledSoftmax()(row_r, row_s)), rel=1e-6)
    # R = I: the paper's 1/N sum_i, bidirectional = mean of both directions.
    eye, square = np.eye(6, dtype=np.float32), scores[:6, :6]
    both = float(CrossExampleSoftmax(bidirectional=True)(eye, square))
    want = 0.5 * (reference_loss(eye, square, cross_example=True) + reference_loss(eye.T, square.T, cross_example=True))
    assert both == pytest.approx(want, rel=1e-6)


def test_large_scale_float16_is_finite(rng):
    relevance, scores = make_batch(rng)
    for cls in [SampledSoftmax, CrossExampleSoftmax, StochasticNegativeMining, CrossExampleNegativeMining]:
        value = float(cls(scale=100.0)(relevance, tf.cast(scores, tf.float16)))
        assert math.isfinite(value)
        assert value == pytest.approx(
            reference_loss(
                relevance,
                tf.cast(tf.cast(scores, tf.float16), tf.float32).numpy(),
                scale=100.0,
                cross_example=cls in (CrossExampleSoftmax, CrossExampleNegativeMining),
                fraction=None if cls in (SampledSoftmax, CrossExampleSoftmax) else 0.5,
            ),
            rel=1e-5,
        )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(negative_fraction=0.0), r"\(0, 1\]"),
        (dict(negative_fraction=1.5), r"\(0, 1\]"),
        (dict(negative_fraction=-0.2), r"\(0, 1\]"),
        (dict(negative_fraction=True), "negative_fraction"),
        (dict(negative_fraction="half"), "negative_fraction"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_k=3, negative_fraction=0.5), "either"),
        (dict(scale=0.0), "scale"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    for cls in [StochasticNegativeMining, CrossExampleNegativeMining]:
        with pytest.raises(ValueError, match=match):
            cls(**kwargs)


@pytest.mark.parametrize("cls,kwargs,ref", CASES, ids=IDS)
def test_functional_form_matches_reference(rng, cls, kwargs, ref):
    """The family's functions (``ce_retrieval.losses.functional``) on the same batches as the classes."""
    function = {
        SampledSoftmax: functional.sampled_softmax,
        StochasticNegativeMining: functional.stochastic_negative_mining,
        CrossExampleSoftmax: functional.cross_example_softmax,
        CrossExampleNegativeMining: functional.cross_example_negative_mining,
    }[cls]
    relevance, scores = make_batch(rng, ties=True)
    np.testing.assert_allclose(
        float(function(relevance, scores, **kwargs)), reference_loss(relevance, scores, **ref), rtol=2e-6
    )
