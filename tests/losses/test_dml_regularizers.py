"""SEC and divergence regularisers: values against NumPy, Keras composition (activity_regularizer / add_loss),
serialisation and mixed precision."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from ce_retrieval.losses import DivergenceLoss, SphericalEmbeddingConstraint


def test_sec_as_activity_regularizer_adds_weighted_norm_variance():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 4)).astype(np.float32)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    inputs = tf_keras.Input((4,))
    raw = tf_keras.layers.Dense(3, use_bias=False, activity_regularizer=SphericalEmbeddingConstraint(0.1))(inputs)
    model = tf_keras.Model(inputs, tf.math.l2_normalize(raw, axis=-1))
    model.layers[1].set_weights([w])
    model(x)
    norms = np.linalg.norm(x @ w, axis=1)
    np.testing.assert_allclose(float(tf.add_n(model.losses)), 0.1 * np.var(norms), rtol=1e-5)
    # gradient of the penalty pulls norms towards their mean
    reg = SphericalEmbeddingConstraint(1.0)
    e = tf.Variable(np.array([[1.0, 0.0], [0.0, 3.0]], np.float32))
    with tf.GradientTape() as tape:
        penalty = reg(e)
    g = tape.gradient(penalty, e).numpy()
    assert g[0, 0] < 0 < g[1, 1]  # grow the short vector, shrink the long one


def test_sec_serialises_and_handles_mixed_precision():
    reg = SphericalEmbeddingConstraint(0.25)
    clone = tf_keras.regularizers.deserialize(tf_keras.regularizers.serialize(reg))
    assert isinstance(clone, SphericalEmbeddingConstraint) and clone.weight == 0.25
    x = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float16)
    value = reg(tf.constant(x))
    assert value.dtype == tf.float32
    norms = np.linalg.norm(x.astype(np.float32), axis=1)
    np.testing.assert_allclose(float(value), 0.25 * np.sum((norms - norms.mean()) ** 2), rtol=1e-5)
    with pytest.raises(ValueError, match="weight"):
        SphericalEmbeddingConstraint(-1.0)
    with pytest.raises(ValueError, match=r"\[batch, \.\.\., dim\]"):
        reg(tf.constant([1.0, 2.0]))


def test_divergence_loss_value_and_keras_composition():
    rng = np.random.default_rng(2)
    heads = [rng.normal(size=(4, 3)).astype(np.float32) for _ in range(3)]
    layer = DivergenceLoss(margin=1.0, weight=0.5)
    out = layer(heads)
    for o, h in zip(out, heads, strict=True):  # returns its input unchanged
        np.testing.assert_array_equal(np.asarray(o), h)
    unit = [h / np.linalg.norm(h, axis=1, keepdims=True) for h in heads]
    want = np.mean(
        [
            sum(max(1.0 - np.sum((unit[a][i] - unit[b][i]) ** 2), 0.0) for a in range(3) for b in range(a + 1, 3))
            for i in range(4)
        ]
    )
    np.testing.assert_allclose(float(layer.losses[0]), 0.5 * want, rtol=1e-5)
    # stacked [B, K, D] input, float16, inside a functional model
    inputs = tf_keras.Input((3, 3), dtype=tf.float16)
    model = tf_keras.Model(inputs, DivergenceLoss(weight=1.0)(inputs))
    model(np.stack(heads, axis=1).astype(np.float16))
    np.testing.assert_allclose(float(model.losses[0]), want, rtol=2e-3)
    clone = DivergenceLoss.from_config(layer.get_config())
    assert clone.margin == 1.0 and clone.weight == 0.5


def test_divergence_loss_errors():
    with pytest.raises(ValueError, match="at least 2 heads"):
        DivergenceLoss()(np.zeros((2, 1, 3), np.float32))
    with pytest.raises(ValueError, match=r"\[batch, heads, dim\]"):
        DivergenceLoss()(np.zeros((2, 3), np.float32))
