"""Checkpoint round trip of the model and both optimizers; mixed-precision steps (bfloat16, float16 + loss scale)."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from modeling_fixtures import make_batch, tiny_config

from ce_retrieval.losses import SampledSoftmax
from ce_retrieval.modeling import OptimizerConfig, build_optimizers, build_two_tower


def _model(vocab_file):
    model = build_two_tower(tiny_config(), vocab_file)
    text_opt, image_opt = build_optimizers(OptimizerConfig.tiny(text_warmup_steps=1), total_steps=50)
    # Eager steps: these tests take 1-3 steps, so tracing the step graph would cost more than it saves.
    model.compile(loss=SampledSoftmax(), text_optimizer=text_opt, image_optimizer=image_opt, run_eagerly=True)
    return model


def _optimizer_state(opt):
    return [v.numpy() for v in opt.variables]


@pytest.mark.slow
def test_checkpoint_round_trip_of_model_and_both_optimizers(vocab_file, tmp_path):
    batch = make_batch()
    ds = tf.data.Dataset.from_tensors(batch).repeat()
    original = _model(vocab_file)
    original.fit(ds, steps_per_epoch=2, verbose=0)
    path = tf.train.Checkpoint(model=original).save(str(tmp_path / "ckpt"))

    restored = _model(vocab_file)
    tf.train.Checkpoint(model=restored).restore(path).assert_existing_objects_matched()
    for a, b in zip(original.get_weights(), restored.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    for name in ("text_optimizer", "image_optimizer"):
        a, b = getattr(original, name), getattr(restored, name)
        assert int(b.iterations) == 2
        assert len(a.variables) > 2  # iterations + slots (Adam moments / SGD momentum)
        for x, y in zip(_optimizer_state(a), _optimizer_state(b), strict=True):
            np.testing.assert_array_equal(x, y)
    # Training on from the restored state is the same as training on from the original.
    original.fit(ds, steps_per_epoch=1, verbose=0)
    restored.fit(ds, steps_per_epoch=1, verbose=0)
    for a, b in zip(original.get_weights(), restored.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_step(vocab_file, policy):
    tf_keras.mixed_precision.set_global_policy(policy)
    model = _model(vocab_file)
    assert model.text_core.get_layer("text_projection").compute_dtype == policy.split("_")[1]
    if policy == "mixed_float16":
        assert isinstance(model.text_optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
        assert isinstance(model.image_optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    before = [w.copy() for w in model.get_weights()]
    batch = make_batch()
    out = model(batch)
    assert out["text"].dtype == tf.float32 and out["image"].dtype == tf.float32
    np.testing.assert_allclose(tf.norm(out["image"], axis=1).numpy(), 1.0, atol=1e-3)
    # Dynamic loss scaling starts at 2^15 and skips (and halves the scale on) steps whose scaled float16
    # gradients overflow, so a few steps may be skipped before the first update lands.
    logs = model.fit(tf.data.Dataset.from_tensors(batch).repeat(), steps_per_epoch=8, verbose=0).history
    assert np.isfinite(logs["loss"][0])
    changed = [np.any(a != b) for a, b in zip(before, model.get_weights(), strict=True)]
    assert sum(changed) > len(changed) // 2
    assert all(v.dtype == tf.float32 for v in model.trainable_variables)  # float32 master weights
