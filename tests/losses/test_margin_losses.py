"""L-Softmax, A-Softmax, CosFace, ArcFace: margins on positives only, sampled or cross-example negatives.
Serialisation, mixed precision, XLA and bad inputs of every loss: ``test_contract.py``."""

import math

import numpy as np
import pytest
import reference as ref
import tensorflow as tf
import tf_keras

from ce_retrieval.losses import (
    AdditiveMarginSoftmax,
    AngularSoftmax,
    AnnealingStepCallback,
    ArcMarginSoftmax,
    LargeMarginSoftmax,
    SampledSoftmax,
    functional,
)
from ce_retrieval.losses.margin_softmax import psi


def batch(rng, n=6, m=9):
    scores = rng.uniform(-0.98, 0.98, size=(n, m)).astype(np.float32)
    relevance = (rng.random((n, m)) < 0.25).astype(np.float32)
    relevance[rng.random((n, m)) < 0.15] = -1
    relevance[np.arange(n), np.arange(n)] = 1
    return relevance, scores


MARGIN_CASES = [
    (LargeMarginSoftmax, dict(margin=2), lambda c: ref.psi(c, 2)),
    (LargeMarginSoftmax, dict(margin=3), lambda c: ref.psi(c, 3)),
    (AngularSoftmax, dict(margin=4), lambda c: ref.sphereface(c, 4, 1000.0)),  # step 0: lambda = base
    (AdditiveMarginSoftmax, dict(margin=0.35), lambda c: c - 0.35),
    (ArcMarginSoftmax, dict(margin=0.5), lambda c: ref.arcface(c, 0.5)),
]
IDS = [f"{c.__name__}-{k['margin']}" for c, k, _ in MARGIN_CASES]


@pytest.mark.parametrize("cls,kwargs,fn", MARGIN_CASES, ids=IDS)
@pytest.mark.parametrize("cross_example", [False, True])
def test_matches_reference(rng, cls, kwargs, fn, cross_example):
    relevance, scores = batch(rng)
    loss = cls(cross_example=cross_example, **kwargs)
    want = ref.softmax(relevance, scores, cross_example=cross_example, positive_fn=fn)
    np.testing.assert_allclose(float(loss(relevance, scores)), want, rtol=1e-5)
    both = cls(cross_example=cross_example, bidirectional=True, **kwargs)
    want_t = ref.softmax(relevance.T, scores.T, cross_example=cross_example, positive_fn=fn)
    np.testing.assert_allclose(float(both(relevance, scores)), 0.5 * (want + want_t), rtol=1e-5)


def test_psi_and_arcface_transforms():
    c = np.linspace(-1, 1, 4001).astype(np.float32)
    for m in (1, 2, 3, 4):
        got = psi(tf.constant(c), m).numpy()
        np.testing.assert_allclose(got, ref.psi(c.astype(np.float64), m), atol=2e-6)
        assert np.all(np.diff(got) >= -1e-6)  # psi decreases with theta, i.e. increases with cos
    arc = ArcMarginSoftmax().positive_cosine(tf.constant(c)).numpy()
    inner = np.abs(c) < 0.9999
    np.testing.assert_allclose(arc[inner], ref.arcface(c[inner].astype(np.float64), 0.5), atol=2e-6)
    assert np.all(np.diff(arc) >= 0)


def test_zero_margins_reduce_to_softmax(rng):
    relevance, scores = batch(rng)
    ss = float(SampledSoftmax()(relevance, scores))
    for loss in [AdditiveMarginSoftmax(margin=0.0), ArcMarginSoftmax(margin=0.0), LargeMarginSoftmax(margin=1)]:
        assert float(loss(relevance, scores)) == pytest.approx(ss, rel=1e-5)
    # Margins only make the positive harder: every margin loss >= sampled softmax.
    for loss in [AdditiveMarginSoftmax(), ArcMarginSoftmax(), LargeMarginSoftmax(), AngularSoftmax()]:
        assert float(loss(relevance, scores)) >= ss - 1e-5


@pytest.mark.parametrize(
    "cls,fn", [(LargeMarginSoftmax, lambda c: ref.psi(c, 2)), (ArcMarginSoftmax, lambda c: ref.arcface(c, 0.5))]
)
def test_gradient_matches_finite_differences(rng, cls, fn):
    relevance, scores = batch(rng, n=4, m=5)
    s = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(s)
        value = cls(scale=2.0)(relevance, s)
    grad = tape.gradient(value, s).numpy()
    numeric = np.zeros(scores.shape)
    eps = 1e-6
    for idx in np.ndindex(*scores.shape):
        up, down = scores.astype(np.float64), scores.astype(np.float64)
        up[idx] += eps
        down[idx] -= eps
        numeric[idx] = (
            ref.softmax(relevance, up, 2.0, positive_fn=fn) - ref.softmax(relevance, down, 2.0, positive_fn=fn)
        ) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, atol=5e-5)


def test_gradients_finite_at_cosine_one():
    relevance = np.eye(3, dtype=np.float32)
    s = tf.constant(np.eye(3, dtype=np.float32))
    for loss in [ArcMarginSoftmax(), LargeMarginSoftmax(), AngularSoftmax(), AdditiveMarginSoftmax()]:
        with tf.GradientTape() as tape:
            tape.watch(s)
            value = loss(relevance, s)
        assert np.all(np.isfinite(tape.gradient(value, s).numpy())) and math.isfinite(float(value))


def test_annealing_schedule_and_callback_survive_checkpoint(tmp_path):
    loss = AngularSoftmax(lambda_base=1000.0, lambda_gamma=0.12, lambda_power=1.0, lambda_min=5.0)
    assert float(loss.annealing_lambda(0)) == pytest.approx(1000.0)
    assert float(loss.annealing_lambda(100)) == pytest.approx(1000.0 / 13.0, rel=1e-6)
    assert float(loss.annealing_lambda(10**6)) == pytest.approx(5.0)

    def model_and_data():
        tf_keras.utils.set_random_seed(0)
        x = tf_keras.Input((4,))
        model = tf_keras.Model(x, tf.math.l2_normalize(tf_keras.layers.Dense(3)(x), -1) @ tf.eye(3, 8))
        data = tf.data.Dataset.from_tensors((tf.random.normal([8, 4]), tf.eye(8))).repeat(5)
        return model, data

    model, data = model_and_data()
    model.compile(optimizer=tf_keras.optimizers.SGD(0.1), loss=loss)
    model.fit(data, epochs=1, verbose=0, callbacks=[AnnealingStepCallback()])
    # on_train_batch_begin sets step = iterations before each of the 5 batches: the last batch ran at step 4.
    assert int(loss.step) == 4 and int(model.optimizer.iterations) == 5
    model.evaluate(data, verbose=0)
    assert int(loss.step) == 4  # evaluation does not advance the schedule
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(tmp_path / "ckpt"))

    resumed_loss = AngularSoftmax()
    model2, data2 = model_and_data()
    model2.compile(optimizer=tf_keras.optimizers.SGD(0.1), loss=resumed_loss)
    model2.optimizer.build(model2.trainable_variables)
    tf.train.Checkpoint(model=model2, optimizer=model2.optimizer).restore(path).assert_existing_objects_matched()
    model2.fit(data2.take(2), epochs=1, verbose=0, callbacks=[AnnealingStepCallback(resumed_loss)])
    assert int(resumed_loss.step) == 6  # continues from the restored iteration count (5, then 6)
    model3, _ = model_and_data()
    model3.compile(optimizer=tf_keras.optimizers.SGD(0.1), loss=SampledSoftmax())
    callback = AnnealingStepCallback()
    callback.set_model(model3)
    with pytest.warns(UserWarning, match="no loss with a `step`"):
        callback.on_train_begin()


def test_bad_arguments():
    for bad in (0, 2.5, -1, True):
        with pytest.raises(ValueError, match="positive integer"):
            LargeMarginSoftmax(margin=bad)
    with pytest.raises(ValueError, match="non-negative"):
        AdditiveMarginSoftmax(margin=-0.1)
    with pytest.raises(ValueError, match="< 1.5708"):
        ArcMarginSoftmax(margin=2.0)
    with pytest.raises(ValueError, match="lambda_min"):
        AngularSoftmax(lambda_min=-1.0)
    with pytest.raises(ValueError, match="scale"):
        ArcMarginSoftmax(scale=-1.0)


def test_xla_reads_the_annealing_step(rng):
    relevance, scores = batch(rng)
    loss = AngularSoftmax(cross_example=True)
    loss.step.assign(50)
    compiled = tf.function(loss, jit_compile=True)
    assert float(compiled(relevance, scores)) == pytest.approx(float(loss(relevance, scores)), rel=1e-6)
    loss.step.assign(5000)  # the variable is read at run time: no retrace, new lambda
    assert float(compiled(relevance, scores)) == pytest.approx(float(loss(relevance, scores)), rel=1e-6)


@pytest.mark.parametrize("cls,kwargs,fn", MARGIN_CASES, ids=IDS)
def test_functional_form_matches_reference(rng, cls, kwargs, fn):
    """The margin functions of ``ce_retrieval.losses.functional`` (A-Softmax takes the annealed lambda itself)."""
    relevance, scores = batch(rng)
    function = {
        LargeMarginSoftmax: functional.large_margin_softmax,
        AngularSoftmax: functional.angular_softmax,
        AdditiveMarginSoftmax: functional.additive_margin_softmax,
        ArcMarginSoftmax: functional.arc_margin_softmax,
    }[cls]
    extra = {"lambda_": 1000.0} if cls is AngularSoftmax else {}
    want = ref.softmax(relevance, scores, cross_example=True, positive_fn=fn)
    np.testing.assert_allclose(
        float(function(relevance, scores, cross_example=True, **kwargs, **extra)), want, rtol=1e-5
    )
