"""Gradient caching (``embedding_chunk``): the plain step's update, chunk by chunk (modeling/grad_cache.py).

Batches of 8 rows in chunks of 2 (4 chunks). Equality holds where the towers act row by row: frozen batch norm
(the tiny text tower has no dropout). Batch norm in 'train' mode normalises each chunk with its own statistics:
tested against the chunk-wise forward under one tape, and shown to differ from the full-batch step.
Under MirroredStrategy: test_modeling_distributed.py; a NaN batch (``on_bad_batch``) under XLA with caching:
tests/tasks/test_every_loss_trains.py.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from modeling_fixtures import make_batch, tiny_config

from ce_retrieval.losses import SampledSoftmax
from ce_retrieval.modeling import build_two_tower
from ce_retrieval.modeling.grad_cache import batchnorm_state

CHUNK = 2
XLA_CHUNK = 4  # two chunks: the step is unrolled chunk by chunk, and XLA's compile time grows with the chunks


def _config(batchnorm="frozen", augment=False, **overrides):
    cfg = tiny_config(augment=augment, **overrides)
    cfg.image = dataclasses.replace(cfg.image, batchnorm=batchnorm)
    if augment:  # crops + colour jitter, no flip (deterministic shapes, random values)
        cfg.image.augmentation = dataclasses.replace(cfg.image.augmentation, horizontal_flip=False)
    return cfg


def _pair(vocab_file, chunk=CHUNK, batchnorm="frozen", jit=False, run_eagerly=False, loss_scale=None, **overrides):
    """(plain model, cached model) with the same initial weights, each with plain SGD (update = -lr * grad);
    ``loss_scale``: the initial scale of mixed_float16's dynamic loss scaling (Keras's default 2^15 overflows
    the tiny towers' first gradients)."""

    def sgd():
        opt = tf_keras.optimizers.SGD(0.1)
        return opt if loss_scale is None else tf_keras.mixed_precision.LossScaleOptimizer(opt, initial_scale=loss_scale)

    models = []
    for embedding_chunk in (0, chunk):
        model = build_two_tower(_config(batchnorm, **overrides), vocab_file)
        scale = 1.0 if overrides.get("learn_logit_scale") else 20.0
        model.compile(
            loss=SampledSoftmax(scale=scale),
            text_optimizer=sgd(),
            image_optimizer=sgd(),
            jit_compile=jit,
            embedding_chunk=embedding_chunk,
            run_eagerly=run_eagerly,
        )
        models.append(model)
    models[1].set_weights(models[0].get_weights())
    return models


def _dense(grads):
    return [tf.convert_to_tensor(g).numpy() for g in grads]


def _assert_grads_close(a, b, rtol=1e-5, atol=2e-6):
    """Equal to float32 rounding: sums over 4 chunks of 2 rows vs over 8 rows, so ``atol`` is relative to the
    tensor's largest entry."""
    for x, y in zip(_dense(a), _dense(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol * max(1.0, float(np.abs(y).max())))


def _max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(_dense(a), _dense(b), strict=True))


@pytest.mark.slow
def test_cached_step_equals_the_full_step(vocab_file):
    """Frozen BN, learned λ (a direct gradient of the loss): same loss, gradients and updated weights."""
    plain, cached = _pair(vocab_file, learn_logit_scale=True)
    inputs = plain._prepare(make_batch(), augment=False)
    loss_p, cos_p, _, text_p, image_p = tf.function(plain._compute_gradients, autograph=False)(*inputs)
    loss_c, cos_c, _, text_c, image_c = tf.function(cached._compute_gradients_cached, autograph=False)(*inputs)
    np.testing.assert_allclose(float(loss_c), float(loss_p), rtol=1e-6)
    np.testing.assert_allclose(cos_c.numpy(), cos_p.numpy(), atol=1e-6)
    # The word-embedding table's gradient stays sparse, as in the plain step.
    assert [type(g) for g in text_c] == [type(g) for g in text_p]
    assert any(isinstance(g, tf.IndexedSlices) for g in text_c)
    _assert_grads_close(text_c, text_p)
    _assert_grads_close(image_c, image_p)
    assert float(tf.abs(text_c[-1])) > 0  # d/d log λ, from the loss alone

    batch = tf.data.Dataset.from_tensors(make_batch())
    before = [v.numpy().copy() for v in plain.text_variables + plain.image_variables]
    logs_p = plain.fit(batch, verbose=0).history
    logs_c = cached.fit(batch, verbose=0).history
    np.testing.assert_allclose(logs_c["loss"], logs_p["loss"], rtol=1e-6)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(plain.get_weights(), cached.get_weights(), strict=True))
    assert diff < 1e-6  # every weight (BN statistics included) after one SGD step of lr 0.1
    assert _max_diff(before, plain.text_variables + plain.image_variables) > 1e-3  # the step moved the weights
    assert int(cached.text_optimizer.iterations.numpy()) == 1 and int(cached.image_optimizer.iterations.numpy()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("tile", [0, 3])
def test_cached_siglip_step_equals_the_full_step_with_learned_t_and_b(vocab_file, tile):
    """SigLIP with learned t and b (the objective's own variables: direct gradients), dense with a TCM regulariser
    and tiled (T = 3): the cached step's loss and gradients are the plain step's."""
    from ce_retrieval.losses import SigmoidLoss, ThresholdConsistentMargin

    learned = dict(logit_scale=10.0, learn_logit_scale=True, logit_bias=-10.0, learn_logit_bias=True)
    models = []
    for embedding_chunk in (0, CHUNK):
        model = build_two_tower(_config(**learned), vocab_file)
        model.compile(
            loss=SigmoidLoss(scale=1.0, bias=0.0),
            regularizers=[] if tile else [(0.5, ThresholdConsistentMargin())],
            text_optimizer=tf_keras.optimizers.SGD(0.1),
            image_optimizer=tf_keras.optimizers.SGD(0.1),
            embedding_chunk=embedding_chunk,
            loss_tile_size=tile,
        )
        models.append(model)
    plain, cached = models
    cached.set_weights(plain.get_weights())
    inputs = plain._prepare(make_batch(), augment=False)
    loss_p, _, _, text_p, image_p = tf.function(plain._compute_gradients, autograph=False)(*inputs)
    loss_c, _, _, text_c, image_c = tf.function(cached._compute_gradients_cached, autograph=False)(*inputs)
    np.testing.assert_allclose(float(loss_c), float(loss_p), rtol=1e-6)
    _assert_grads_close(text_c, text_p)
    _assert_grads_close(image_c, image_p)
    assert [v.name.split("/")[-1] for v in cached.text_variables[-2:]] == ["log_logit_scale:0", "logit_bias:0"]
    assert all(abs(float(g)) > 0 for g in text_c[-2:])


@pytest.mark.slow
def test_xla_cached_step_matches_the_graph_step(vocab_file):
    plain, cached = _pair(vocab_file, chunk=XLA_CHUNK, jit=True)
    inputs = plain._prepare(make_batch(), augment=False)
    loss_x, _, _, text_x, image_x = cached._compute_gradients_jit(*inputs)
    loss_p, _, _, text_p, image_p = tf.function(plain._compute_gradients, autograph=False)(*inputs)
    np.testing.assert_allclose(float(loss_x), float(loss_p), rtol=1e-4)
    _assert_grads_close(text_x + image_x, text_p + image_p, rtol=2e-3, atol=1e-5)
    logs = cached.fit(tf.data.Dataset.from_tensors(make_batch()), verbose=0).history
    assert np.isfinite(logs["loss"][0]) and int(cached.image_optimizer.iterations.numpy()) == 1


@pytest.mark.slow
def test_train_mode_batchnorm_uses_chunk_statistics(vocab_file):
    """'train' BN: the cached gradient is the gradient of the chunk-wise forward (each chunk normalised with its
    own statistics), not of the full-batch forward; moving statistics get one update per chunk."""
    plain, cached = _pair(vocab_file, batchnorm="train")
    inputs = plain._prepare(make_batch(), augment=False)
    text_inputs, pixels, ids = inputs

    @tf.function(autograph=False)
    def chunkwise_reference():
        """One tape over the chunk-wise forward: the function whose gradient gradient caching computes."""
        with tf.GradientTape() as tape:
            slices = [slice(k, k + CHUNK) for k in range(0, 8, CHUNK)]
            text = tf.concat(
                [plain.text_core({k: v[s] for k, v in text_inputs.items()}, training=True) for s in slices], 0
            )
            image = tf.concat([plain.image_core(pixels[s], training=True) for s in slices], 0)
            loss = plain.objective_terms(text, image, ids)[0]
        return loss, tape.gradient(loss, plain.text_variables + plain.image_variables)

    full_grads = tf.function(cached._compute_gradients, autograph=False)(*inputs)  # updates cached's BN stats once
    cached.set_weights(plain.get_weights())  # undo those updates
    state_before = [v.numpy().copy() for v in batchnorm_state(cached.image_core)]
    loss_c, _, _, text_c, image_c = tf.function(cached._compute_gradients_cached, autograph=False)(*inputs)
    loss_r, grads_r = chunkwise_reference()  # updates plain's moving statistics once per chunk
    np.testing.assert_allclose(float(loss_c), float(loss_r), rtol=1e-6)
    _assert_grads_close(text_c + image_c, grads_r, rtol=1e-4, atol=1e-6)
    assert _max_diff(image_c, full_grads[4]) > 1e-4  # the full batch's statistics give another gradient
    # Moving statistics: K updates from pass 2 only (pass 1's are undone), as in the chunk-wise forward.
    state_c = [v.numpy() for v in batchnorm_state(cached.image_core)]
    state_r = [v.numpy() for v in batchnorm_state(plain.image_core)]
    assert max(float(np.abs(a - b).max()) for a, b in zip(state_before, state_c, strict=True)) > 1e-5
    for a, b in zip(state_c, state_r, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_both_passes_see_the_same_augmented_pixels(vocab_file):
    """Augmentation runs once per step in _prepare: the cached step's update equals the plain gradient on the
    pixels it augmented (recorded), applied with the same SGD."""
    plain, cached = _pair(vocab_file, augment=True, run_eagerly=True)
    assert cached.augmentation is not None
    recorded = []
    prepare = cached._prepare

    def recording_prepare(data, augment):
        out = prepare(data, augment)
        recorded.append(out)
        return out

    cached._prepare = recording_prepare
    cached.train_on_batch(make_batch())
    (inputs,) = recorded
    unaugmented = plain._prepare(make_batch(), augment=False)[1]
    assert float(tf.reduce_max(tf.abs(inputs[1] - unaugmented))) > 1e-3  # augmentation did change the pixels
    _, _, _, text_p, image_p = plain._compute_gradients(*inputs)
    for var, grad in zip(plain.text_variables + plain.image_variables, text_p + image_p, strict=True):
        var.assign_sub(0.1 * tf.convert_to_tensor(grad))
    assert (
        _max_diff(plain.text_variables + plain.image_variables, cached.text_variables + cached.image_variables) < 1e-6
    )


@pytest.mark.slow
def test_mixed_float16_with_loss_scaling_under_xla(vocab_file):
    policy = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        # Both steps under XLA, so that caching is the only difference: in float16, XLA's CPU code and the graph's
        # kernels round differently (on an Intel Xeon with native float16, by 2.4 % of the largest gradient entry
        # for the plain step alone, against 0.07 % between the cached and plain steps under XLA).
        plain, cached = _pair(vocab_file, chunk=XLA_CHUNK, jit=True, loss_scale=2.0**8)
        assert cached._loss_scaling
        inputs = plain._prepare(make_batch(), augment=False)
        plain_xla = tf.function(plain._compute_gradients, autograph=False, jit_compile=True)
        loss_p, _, _, text_p, image_p = plain_xla(*inputs)
        loss_c, _, _, text_c, image_c = cached._compute_gradients_jit(*inputs)
        np.testing.assert_allclose(float(loss_c), float(loss_p), rtol=1e-3)
        assert all(np.isfinite(g).all() for g in _dense(text_c + image_c + text_p + image_p))
        # Half-precision towers on 4 rows vs 8: the same function, other rounding.
        scale = max(float(np.abs(g).max()) for g in _dense(text_p + image_p))
        assert _max_diff(text_c + image_c, text_p + image_p) < 5e-3 * scale
        logs = cached.fit(tf.data.Dataset.from_tensors(make_batch()), verbose=0).history
        assert np.isfinite(logs["loss"][0])
        assert (
            int(cached.text_optimizer.iterations.numpy()) == 1 and int(cached.image_optimizer.iterations.numpy()) == 1
        )
    finally:
        tf_keras.mixed_precision.set_global_policy(policy)


@pytest.mark.slow
def test_refused_settings_and_config_wiring(vocab_file, tmp_path):
    opts = dict(
        loss=SampledSoftmax(), text_optimizer=tf_keras.optimizers.SGD(), image_optimizer=tf_keras.optimizers.SGD()
    )
    model = build_two_tower(_config(), vocab_file)
    with pytest.raises(ValueError, match="embedding_chunk must be >= 0"):
        model.compile(embedding_chunk=-1, **opts)
    model.compile(embedding_chunk=3, **opts)
    with pytest.raises(ValueError, match=r"embedding_chunk=3 must divide the per-replica batch \(8 rows"):
        model.train_on_batch(make_batch())

    cfg = _config()
    cfg.text = dataclasses.replace(cfg.text, dropout_rate=0.1)
    with pytest.raises(ValueError, match="dropout draws other masks"):
        build_two_tower(cfg, vocab_file).compile(embedding_chunk=CHUNK, **opts)
    build_two_tower(cfg, vocab_file).compile(embedding_chunk=0, **opts)  # dropout without caching: fine

    from ce_retrieval.configs import ConfigError, from_dict
    from ce_retrieval.configs.experiment import ExperimentConfig
    from ce_retrieval.tasks import RetrievalTask

    with pytest.raises(ConfigError, match="embedding_chunk must be 0/null"):
        from_dict(ExperimentConfig, {"train": {"batch_size": 64, "embedding_chunk": 24}})
    experiment = from_dict(ExperimentConfig, {"train": {"batch_size": 8, "embedding_chunk": 4}})
    assert from_dict(ExperimentConfig, {}).train.embedding_chunk is None  # default: off
    experiment.model = _config()
    compiled = RetrievalTask(experiment).build_compiled_model(vocab_file, total_steps=10)
    assert compiled.embedding_chunk == 4 and compiled._compute_step == compiled._compute_gradients_cached
