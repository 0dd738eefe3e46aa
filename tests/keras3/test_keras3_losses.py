"""The Keras 3 loss classes (``ce_retrieval.keras``) against the tf_keras classes they wrap, in this process.

``import keras`` is Keras 3 whatever ``TF_USE_LEGACY_KERAS`` says (the switch only redirects ``tf.keras``), so
these tests run in the test session; the fresh plain-Keras-3 processes are in ``test_keras3_process.py``.
"""

import inspect
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import ce_retrieval.keras as k3
from ce_retrieval import losses
from ce_retrieval.keras import _backend

PACKAGE_LOSSES = sorted(
    name for name in losses.available() if losses.lookup(name).__module__.startswith("ce_retrieval.losses.")
)
EXPOSED = [name for name in PACKAGE_LOSSES if name not in k3.EXCLUDED]


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def inputs_for(cls):
    """``(relevance, scores, ids)`` for ``cls`` by its capabilities; ``ids`` is None where S is not square."""
    rng = np.random.default_rng(0)
    if cls.needs_proxies:  # S = cos(E, P): 9 examples of 3 classes against K proxies per class
        k = 10 if cls is losses.SoftTripleLoss else 1
        labels = np.arange(9) % 3
        centres = rng.normal(size=(3, 6))
        e = _unit(centres[labels] + 0.8 * rng.normal(size=(9, 6)))
        p = _unit(np.repeat(centres, k, axis=0) + 0.5 * rng.normal(size=(3 * k, 6)))
        return (labels[:, None] == (np.arange(3 * k) // k)[None, :]).astype(np.float32), e @ p.T, None
    ids = np.array([0, 0, 0, 1, 1, 2, 2, 3, 4, 4])
    centres = rng.normal(size=(5, 6))
    texts = _unit(centres[ids] + 0.9 * rng.normal(size=(10, 6)))
    others = texts if cls.needs_gram else _unit(centres[ids] + 0.5 * rng.normal(size=(10, 6)))
    relevance = losses.relevance_from_ids(ids, ids, exclude_self=cls.needs_gram).numpy()
    return relevance, texts @ others.T, ids


def _variants(name):
    cls = losses.lookup(name)
    return [{}] + ([{"bidirectional": True}] if cls.supports_bidirectional else [])


CASES = [(name, kwargs) for name in EXPOSED for kwargs in _variants(name)]


def test_every_package_loss_is_exposed():
    assert k3.available() == EXPOSED == sorted(PACKAGE_LOSSES) and not k3.EXCLUDED
    for name in EXPOSED:
        cls = getattr(k3, name)
        assert issubclass(cls, keras.losses.Loss) and cls.tf_keras_class is losses.lookup(name)
        assert keras.saving.get_registered_object(f"ce_retrieval>{name}") is cls
    assert type(k3.get("cross_example_softmax", scale=5.0)) is k3.CrossExampleSoftmax
    assert type(k3.get("angular_softmax")) is k3.AngularSoftmax


def test_angular_softmax_anneals_with_the_keras3_callback():
    """fit advances the loss's step to optimizer.iterations, so λ decays as in the tf_keras class."""
    rng = np.random.default_rng(0)
    inputs = keras.Input((6,))
    model = keras.Model(inputs, k3.SimilarityMatrix()([keras.layers.Dense(4)(inputs), inputs[:, :4]]))
    loss = k3.AngularSoftmax(lambda_gamma=0.5)
    model.compile(optimizer="sgd", loss=loss)
    start = float(loss.core.annealing_lambda())
    x, ids = rng.normal(size=(24, 6)).astype("float32"), np.arange(24)
    model.fit(x, ids, batch_size=8, epochs=1, verbose=0, callbacks=[k3.AnnealingStepCallback()])
    assert int(loss.core.step.numpy()) == 2  # set before each of the 3 batches: 0, 1, 2
    assert float(loss.core.annealing_lambda()) < start


@pytest.mark.parametrize("name", EXPOSED)
def test_constructor_arguments_and_defaults_match(name):
    ours = inspect.signature(getattr(k3, name)).parameters
    theirs = inspect.signature(losses.lookup(name).__init__).parameters
    for key, parameter in theirs.items():
        if key != "self" and parameter.kind is not inspect.Parameter.VAR_KEYWORD:
            assert key in ours and ours[key].default == parameter.default, key
    assert ours["reduction"].default == "sum_over_batch_size"
    assert getattr(k3, name)().name == losses.lookup(name)().name


@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{'bi' if kw else 'default'}" for n, kw in CASES])
def test_value_equals_tf_keras_class(name, kwargs):
    relevance, scores, ids = inputs_for(losses.lookup(name))
    expected = float(losses.lookup(name)(**kwargs)(relevance, scores))
    loss = getattr(k3, name)(**kwargs)
    value = loss(relevance, scores)
    assert value.dtype == tf.float32 and value.shape == ()
    np.testing.assert_allclose(float(value), expected, rtol=1e-6)
    if ids is not None:  # the id form of y_true, as given and as Keras 3 casts it (float32, [N, 1])
        for y_true in (ids, ids.astype(np.float32)[:, None]):
            np.testing.assert_allclose(float(loss(y_true, scores)), expected, rtol=1e-6)


@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{'bi' if kw else 'default'}" for n, kw in CASES])
def test_config_round_trip(name, kwargs):
    cls = getattr(k3, name)
    loss = cls(**kwargs, name="renamed", reduction="sum")
    config = loss.get_config()
    assert config == {**losses.lookup(name)(**kwargs, name="renamed").get_config(), "reduction": "sum"}
    relevance, scores, _ = inputs_for(cls.tf_keras_class)
    again = cls.from_config(json.loads(json.dumps(config)))
    clone = keras.losses.deserialize(keras.losses.serialize(loss))
    for other in (again, clone):
        assert type(other) is cls and other.get_config() == config
        np.testing.assert_allclose(float(other(relevance, scores)), float(loss(relevance, scores)), rtol=1e-6)


def test_hyperparameters_are_validated_by_the_tf_keras_class():
    with pytest.raises(ValueError, match="negative_fraction|top_k"):
        k3.CrossExampleNegativeMining(negative_fraction=0.5, top_k=3)
    with pytest.raises(ValueError, match="bidirectional"):
        k3.SymmetricInfoNCE(bidirectional=False)
    with pytest.raises(ValueError, match="reduction"):
        k3.CrossExampleSoftmax(reduction="auto")


def test_bad_inputs_raise_clear_errors():
    loss = k3.CrossExampleSoftmax()
    scores = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match="sample_weight"):
        loss(np.arange(4), scores, sample_weight=np.ones(4))
    with pytest.raises(ValueError, match="square"):
        loss(np.arange(4), np.ones((4, 3), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        loss(2.0 * np.eye(4, dtype=np.float32), scores)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no positive"):
        loss(np.zeros((4, 4), np.float32), scores)


def test_ids_of_a_gram_loss_ignore_self_pairs():
    relevance, scores, ids = inputs_for(losses.AngularLoss)
    assert np.all(np.diag(relevance) == -1)
    np.testing.assert_allclose(
        float(k3.AngularLoss()(ids, scores)), float(losses.AngularLoss()(relevance, scores)), rtol=1e-6
    )


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_half_precision_scores_give_a_float32_loss(dtype):
    relevance, scores, ids = inputs_for(losses.CrossExampleSoftmax)
    half = tf.cast(scores, dtype)
    value = k3.CrossExampleSoftmax()(ids, half)
    assert value.dtype == tf.float32
    np.testing.assert_allclose(float(value), float(losses.CrossExampleSoftmax()(relevance, tf.cast(half, tf.float32))))


def test_similarity_matrix_stays_float32_under_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        left, right = keras.Input((5,)), keras.Input((5,))
        layer = k3.SimilarityMatrix()
        output = layer([keras.layers.Dense(4)(left), keras.layers.Dense(4)(right)])
        assert keras.layers.Dense(4).compute_dtype == "float16" and output.dtype == "float32"
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("name", ["CrossExampleSoftmax", "CrossExampleNegativeMining", "InfoNCE", "ContrastiveLoss"])
def test_traces_under_xla(name):
    relevance, scores, ids = inputs_for(losses.lookup(name))
    loss = getattr(k3, name)()
    compiled = tf.function(lambda y_true, y_pred: loss(y_true, y_pred), jit_compile=True)
    np.testing.assert_allclose(float(compiled(ids, scores)), float(loss(relevance, scores)), rtol=1e-5)


def test_similarity_matrix_values_and_config():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(5, 4)).astype(np.float32)
    layer = k3.SimilarityMatrix()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer([a, b])), _unit(a) @ _unit(b).T, atol=1e-6)
    raw = k3.SimilarityMatrix.from_config(k3.SimilarityMatrix(normalize=False, name="dot").get_config())
    assert raw.name == "dot" and not raw.normalize
    np.testing.assert_allclose(keras.ops.convert_to_numpy(raw([a, b])), a @ b.T, rtol=1e-5)
    assert layer.compute_output_shape([(3, 4), (5, 4)]) == (3, 5)


def test_losses_require_the_tensorflow_backend(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(RuntimeError, match="'jax'.*KERAS_BACKEND=tensorflow"):
        k3.CrossExampleSoftmax()
    with pytest.raises(RuntimeError, match="TripletLoss"):
        _backend.require_tensorflow_backend("TripletLoss")


def test_string_ids():
    relevance, scores, _ = inputs_for(losses.CrossExampleSoftmax)
    names = np.array(["a", "a", "a", "b", "b", "c", "c", "d", "e", "e"])
    np.testing.assert_allclose(
        float(k3.CrossExampleSoftmax()(names, scores)),
        float(losses.CrossExampleSoftmax()(relevance, scores)),
        rtol=1e-6,
    )
