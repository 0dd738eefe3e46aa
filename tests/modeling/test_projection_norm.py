"""``model.projection_norm='batchnorm'``: both towers' features standardised before the projection.

Checked against NumPy (batch statistics in training: (h - mean_B h) / sqrt(var_B h + eps), then W, then L2), the
served path (moving statistics: one example's embedding does not depend on the batch around it, and the export
serves what the Keras encoder computes), and the config's refusal of an unknown choice.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from modeling_fixtures import make_batch, tiny_config

from ce_retrieval.losses import SampledSoftmax
from ce_retrieval.modeling import ModelConfig, build_two_tower


def test_an_unknown_projection_norm_is_refused_with_its_name():
    with pytest.raises(ValueError, match=r"model\.projection_norm must be one of \['none', 'batchnorm'\]"):
        ModelConfig(projection_norm="layernorm")
    assert ModelConfig().projection_norm == "none"  # the paper's head stays the default


def _head(core, prefix):
    """(features before the norm, the norm layer, the projection kernel) of one tower's core."""
    norm = core.get_layer(f"{prefix}_projection_norm")
    features = tf_keras.Model(core.inputs, norm.input)
    return features, norm, core.get_layer(f"{prefix}_projection").kernel.numpy().astype(np.float64)


def _reference(h, kernel, mean, var, eps):
    z = (h - mean) / np.sqrt(var + eps)
    p = z @ kernel
    return p / np.linalg.norm(p, axis=1, keepdims=True), p


def test_batchnorm_head_matches_numpy_with_batch_then_moving_statistics(vocab_file):
    model = build_two_tower(tiny_config(projection_norm="batchnorm"), vocab_file)
    text_inputs, pixels, _ = model._prepare(make_batch(), augment=False)
    for prefix, core, inputs in (("text", model.text_core, text_inputs), ("image", model.image_core, pixels)):
        features, norm, kernel = _head(core, prefix)
        assert norm.center is False and norm.scale is False  # no offset or gain for the projection to absorb
        h = features(inputs, training=True).numpy().astype(np.float64)
        trained, projected = _reference(h, kernel, h.mean(0), h.var(0), norm.epsilon)
        np.testing.assert_allclose(core(inputs, training=True).numpy(), trained, atol=2e-5, err_msg=prefix)
        np.testing.assert_allclose(projected.sum(0), 0.0, atol=1e-4 * np.abs(projected).max())  # centred
        h = features(inputs, training=False).numpy().astype(np.float64)
        mean, var = norm.moving_mean.numpy(), norm.moving_variance.numpy()
        served, _ = _reference(h, kernel, mean, var, norm.epsilon)
        np.testing.assert_allclose(core(inputs, training=False).numpy(), served, atol=2e-5, err_msg=prefix)


def test_training_moves_the_statistics_and_serving_does_not_depend_on_the_batch(vocab_file, tmp_path):
    from ce_retrieval.build.export import export_encoders

    model = build_two_tower(tiny_config(projection_norm="batchnorm"), vocab_file)
    model.compile(
        loss=SampledSoftmax(scale=20.0),
        text_optimizer=tf_keras.optimizers.Adam(1e-3),
        image_optimizer=tf_keras.optimizers.SGD(1e-3),
        run_eagerly=True,  # two steps: no tracing
    )
    batch = make_batch()
    model.fit(tf.data.Dataset.from_tensors(batch).repeat(2), verbose=0)
    for prefix, core in (("text", model.text_core), ("image", model.image_core)):
        assert np.abs(core.get_layer(f"{prefix}_projection_norm").moving_mean.numpy()).max() > 0, prefix

    captions, images = batch["caption"], batch["image"]
    for encoder, raw in ((model.text_encoder, captions), (model.image_encoder, images)):
        whole = encoder(raw, training=False).numpy()
        alone = np.concatenate([encoder(raw[i : i + 1], training=False).numpy() for i in range(len(whole))])
        np.testing.assert_allclose(alone, whole, atol=1e-5)  # moving statistics: each row on its own
        in_batch = encoder(raw, training=True).numpy()
        assert np.abs(in_batch - whole).max() > 1e-3  # training uses the batch's statistics instead

    paths = export_encoders(model.text_encoder, model.image_encoder, str(tmp_path / "export"))  # verify=True
    for path, inp, encoder, raw in (
        (paths.text_encoder, "text", model.text_encoder, captions),
        (paths.image_encoder, "image_bytes", model.image_encoder, images),
    ):
        served = tf.saved_model.load(path).signatures["serving_default"](**{inp: raw})["embedding"]
        np.testing.assert_allclose(served.numpy(), encoder(raw, training=False).numpy(), atol=1e-5, err_msg=inp)
