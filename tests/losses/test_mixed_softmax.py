"""MixedSoftmax: (1 − α_t) · L_row + α_t · L_cross with α_t warmed up over steps; values and gradients against the
float64 NumPy reference, its limits (SampledSoftmax, CrossExampleSoftmax), the schedule and its refusals.
Serialisation, mixed precision, XLA and bad inputs of every loss: ``test_contract.py``."""

import numpy as np
import pytest
import reference as ref
import tensorflow as tf
import tf_keras

from ce_retrieval.losses import (
    AnnealingStepCallback,
    CrossExampleSoftmax,
    MixedSoftmax,
    SampledSoftmax,
    functional,
)


def batch(rng, n=6, m=9):
    scores = rng.uniform(-0.98, 0.98, size=(n, m)).astype(np.float32)
    relevance = (rng.random((n, m)) < 0.25).astype(np.float32)
    relevance[rng.random((n, m)) < 0.15] = -1
    relevance[np.arange(n), np.arange(n)] = 1
    return relevance, scores


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("scale", [1.0, 20.0])
def test_matches_reference(rng, alpha, scale):
    relevance, scores = batch(rng)
    value = float(MixedSoftmax(cross_weight=alpha, scale=scale)(relevance, scores))
    assert value == pytest.approx(ref.mixed_softmax(relevance, scores, scale, alpha), rel=1e-5)
    functional_value = float(functional.mixed_softmax(relevance, scores, scale=scale, cross_weight=alpha))
    assert functional_value == pytest.approx(value, rel=1e-6)


def test_bidirectional_matches_reference(rng):
    relevance, scores = batch(rng)
    value = float(MixedSoftmax(cross_weight=0.4, bidirectional=True)(relevance, scores))
    expected = 0.5 * (
        ref.mixed_softmax(relevance, scores, 20.0, 0.4) + ref.mixed_softmax(relevance.T, scores.T, 20.0, 0.4)
    )
    assert value == pytest.approx(expected, rel=1e-5)


def test_limits_are_the_two_paper_losses(rng):
    relevance, scores = batch(rng)
    sampled = float(SampledSoftmax(scale=7.0)(relevance, scores))
    cross = float(CrossExampleSoftmax(scale=7.0)(relevance, scores))
    assert float(MixedSoftmax(cross_weight=0.0, scale=7.0)(relevance, scores)) == pytest.approx(sampled, rel=1e-6)
    assert float(MixedSoftmax(cross_weight=1.0, scale=7.0)(relevance, scores)) == pytest.approx(cross, rel=1e-6)


def test_gradient_matches_finite_differences(rng):
    relevance, scores = batch(rng, n=4, m=5)
    s = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(s)
        value = MixedSoftmax(cross_weight=0.35, scale=3.0)(relevance, s)
    grad = tape.gradient(value, s).numpy()
    numeric = np.zeros(scores.shape)
    eps = 1e-6
    for idx in np.ndindex(*scores.shape):
        up, down = scores.astype(np.float64), scores.astype(np.float64)
        up[idx] += eps
        down[idx] -= eps
        numeric[idx] = (ref.mixed_softmax(relevance, up, 3.0, 0.35) - ref.mixed_softmax(relevance, down, 3.0, 0.35)) / (
            2 * eps
        )
    np.testing.assert_allclose(grad, numeric, atol=5e-5)
    assert np.abs(numeric).max() > 1e-2  # the check compares real gradients, not zeros


def test_warmup_schedule_and_callback(rng):
    relevance, scores = batch(rng)
    loss = MixedSoftmax(cross_weight=0.8, warmup_steps=10)
    assert [float(loss.current_cross_weight(t)) for t in (0, 5, 10, 1000)] == pytest.approx([0.0, 0.4, 0.8, 0.8])
    loss.step.assign(5)
    assert float(loss(relevance, scores)) == pytest.approx(ref.mixed_softmax(relevance, scores, 20.0, 0.4), rel=1e-5)
    compiled = tf.function(loss, jit_compile=True)
    assert float(compiled(relevance, scores)) == pytest.approx(float(loss(relevance, scores)), rel=1e-6)
    loss.step.assign(500)  # read at run time: no retrace, the new α
    want = ref.mixed_softmax(relevance, scores, 20.0, 0.8)
    assert float(compiled(relevance, scores)) == pytest.approx(want, rel=1e-5)

    tf_keras.utils.set_random_seed(0)
    x = tf_keras.Input((4,))
    model = tf_keras.Model(x, tf.math.l2_normalize(tf_keras.layers.Dense(3)(x), -1) @ tf.eye(3, 8))
    fitted = MixedSoftmax(cross_weight=0.5, warmup_steps=100)
    model.compile(optimizer=tf_keras.optimizers.SGD(0.1), loss=fitted)
    data = tf.data.Dataset.from_tensors((tf.random.normal([8, 4]), tf.eye(8))).repeat(3)
    model.fit(data, epochs=1, verbose=0, callbacks=[AnnealingStepCallback()])
    assert int(fitted.step) == 2  # the callback drives the schedule (step = iterations before each batch)


def test_bad_arguments_and_refused_paths():
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match="cross_weight must be a number in \\[0, 1\\]"):
            MixedSoftmax(cross_weight=bad)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="warmup_steps must be a non-negative integer"):
            MixedSoftmax(warmup_steps=bad)
    with pytest.raises(ValueError, match="tile_size is not supported"):
        MixedSoftmax(tile_size=64)
    from ce_retrieval.objective import RetrievalObjective

    with pytest.raises(ValueError, match="MixedSoftmax cannot"):
        RetrievalObjective(MixedSoftmax(), partition="sharded")
    with pytest.raises(ValueError, match="MixedSoftmax has none"):
        RetrievalObjective(MixedSoftmax(), tile_size=64)
