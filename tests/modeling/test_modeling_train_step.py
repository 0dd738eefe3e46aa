"""Train step: two optimizers, loss decreases on a fixed batch, schedules, logit-scale wiring."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from modeling_fixtures import make_batch, tiny_config

from ce_retrieval.losses import SampledSoftmax, TripletLoss
from ce_retrieval.modeling import OptimizerConfig, WarmupLinearDecay, build_optimizers, build_two_tower


def test_schedule_values_at_key_steps():
    text = WarmupLinearDecay(1e-4, total_steps=25_000, warmup_steps=1_500, end_learning_rate=0.0)
    expected = {0: 0.0, 750: 5e-5, 1_500: 1e-4, 13_250: 5e-5, 25_000: 0.0, 30_000: 0.0}
    for step, lr in expected.items():
        np.testing.assert_allclose(float(text(step)), lr, rtol=1e-5, atol=1e-12, err_msg=f"step {step}")
    image = WarmupLinearDecay(3e-3, total_steps=25_000, end_learning_rate=5e-4)
    for step, lr in {0: 3e-3, 12_500: 1.75e-3, 25_000: 5e-4, 40_000: 5e-4}.items():
        np.testing.assert_allclose(float(image(step)), lr, rtol=1e-5, err_msg=f"step {step}")
    clone = WarmupLinearDecay.from_config(text.get_config())
    assert float(clone(900)) == pytest.approx(float(text(900)))


def test_build_optimizers_follow_the_paper():
    text_opt, image_opt = build_optimizers(OptimizerConfig(), total_steps=25_000)
    assert isinstance(text_opt, tf_keras.optimizers.AdamW) and isinstance(image_opt, tf_keras.optimizers.SGD)
    # The schedules survive the optimizers' serialisation (what BackupAndRestore / SavedModel rely on).
    text_lr = tf_keras.optimizers.schedules.deserialize(text_opt.get_config()["learning_rate"])
    image_lr = tf_keras.optimizers.schedules.deserialize(image_opt.get_config()["learning_rate"])
    assert isinstance(text_lr, WarmupLinearDecay) and isinstance(image_lr, WarmupLinearDecay)
    assert float(text_lr(0)) == 0.0 and float(text_lr(1_500)) == pytest.approx(1e-4)
    assert float(image_lr(0)) == pytest.approx(3e-3) and float(image_lr(25_000)) == pytest.approx(5e-4)
    assert float(text_opt.weight_decay) == pytest.approx(0.01)
    assert image_opt.momentum == pytest.approx(0.9)
    with pytest.raises(ValueError, match="total_steps"):
        build_optimizers(OptimizerConfig(), total_steps=0)


@pytest.mark.parametrize("exclude", [[], ["LayerNorm"]])
def test_text_optimizer_never_decays_the_learned_logit_scale_and_bias(vocab_file, exclude):
    """CLIP and SigLIP never decay log λ and b: with weight decay and a zero gradient an AdamW step leaves them as
    they are, whatever the user's exclude list, while an ordinary kernel shrinks by lr·wd."""
    model = build_two_tower(tiny_config(learn_logit_scale=True, logit_bias=-10.0, learn_logit_bias=True), vocab_file)
    config = OptimizerConfig(
        text_learning_rate=0.1, text_warmup_steps=0, text_weight_decay=0.5, text_exclude_from_weight_decay=exclude
    )
    text_opt, _ = build_optimizers(config, total_steps=10)
    variables = model.text_variables
    kernel = next(v for v in variables if v.shape.rank == 2 and "kernel" in v.name)
    kept = [model.log_logit_scale, model.logit_bias_variable]
    assert {id(v) for v in kept} <= {id(v) for v in variables}  # the text optimizer updates them
    before = [v.numpy().copy() for v in [kernel, *kept]]
    text_opt.apply_gradients([(tf.zeros_like(v), v) for v in variables])
    np.testing.assert_allclose(kernel.numpy(), before[0] * (1.0 - 0.1 * 0.5), rtol=1e-5)
    for variable, value in zip(kept, before[1:], strict=True):
        assert variable.numpy() == value, variable.name


def _compiled(vocab_file, run_eagerly=False, **cfg_overrides):
    model = build_two_tower(tiny_config(**cfg_overrides), vocab_file)
    text_opt = tf_keras.optimizers.Adam(1e-3)
    image_opt = tf_keras.optimizers.SGD(1e-3, momentum=0.9)
    scale = 1.0 if cfg_overrides.get("learn_logit_scale") else 20.0
    model.compile(
        loss=SampledSoftmax(scale=scale), text_optimizer=text_opt, image_optimizer=image_opt, run_eagerly=run_eagerly
    )
    return model


@pytest.mark.slow
def test_train_step_reduces_the_loss_and_updates_both_towers(vocab_file):
    model = _compiled(vocab_file)
    batch = make_batch()
    text_before = [v.numpy().copy() for v in model.text_variables]
    image_before = [v.numpy().copy() for v in model.image_variables]
    history = model.fit(tf.data.Dataset.from_tensors(batch).repeat(), epochs=15, steps_per_epoch=1, verbose=0).history
    assert set(history) == {"loss", "in_batch_recall_at_1"}
    losses = history["loss"]
    assert min(losses[-3:]) < 0.75 * losses[0], losses
    assert all(b < a for a, b in zip(losses[-6:-1], losses[-5:], strict=True)), losses  # steadily decreasing
    recall = history["in_batch_recall_at_1"]
    assert recall[-1] >= 0.5 and recall[-1] > recall[0], recall
    assert model.text_optimizer.iterations.numpy() == 15 and model.image_optimizer.iterations.numpy() == 15
    assert all(
        np.any(a != b.numpy()) for a, b in zip(text_before, model.text_variables, strict=True) if b.shape.rank == 2
    )
    assert all(
        np.any(a != b.numpy()) for a, b in zip(image_before, model.image_variables, strict=True) if b.shape.rank == 4
    )


def test_logit_scale_wiring(vocab_file):
    model = build_two_tower(tiny_config(), vocab_file)
    opts = dict(text_optimizer=tf_keras.optimizers.Adam(), image_optimizer=tf_keras.optimizers.SGD())
    with pytest.raises(ValueError, match="logit scale mismatch"):
        model.compile(loss=SampledSoftmax(scale=10.0), **opts)
    with pytest.raises(ValueError, match="distinct"):
        opt = tf_keras.optimizers.SGD()
        model.compile(loss=SampledSoftmax(), text_optimizer=opt, image_optimizer=opt)
    assert float(model.logit_scale) == pytest.approx(20.0)

    learned = _compiled(vocab_file, run_eagerly=True, learn_logit_scale=True)  # eager: 2 steps, no tracing
    assert float(learned.logit_scale) == pytest.approx(20.0, rel=1e-5)
    assert any(v is learned.log_logit_scale for v in learned.text_variables)
    with pytest.raises(ValueError, match="TripletLoss has none"):
        learned.compile(loss=TripletLoss(), **opts)  # raises before changing the compiled state
    logs = learned.fit(tf.data.Dataset.from_tensors(make_batch()).repeat(2), verbose=0).history
    assert "logit_scale" in logs
    assert float(learned.logit_scale) != pytest.approx(20.0, rel=1e-7)


@pytest.mark.slow
def test_xla_compiled_step_matches_the_graph_step(vocab_file):
    model = build_two_tower(tiny_config(), vocab_file)
    model.compile(
        loss=SampledSoftmax(),
        text_optimizer=tf_keras.optimizers.SGD(0.1),
        image_optimizer=tf_keras.optimizers.SGD(0.1),
        jit_compile=True,
    )
    inputs = model._prepare(make_batch(), augment=False)
    loss_xla, _, _, text_xla, image_xla = model._compute_gradients_jit(*inputs)
    loss_ref, _, _, text_ref, image_ref = tf.function(model._compute_gradients, autograph=False)(*inputs)
    np.testing.assert_allclose(float(loss_xla), float(loss_ref), rtol=1e-4)
    for a, b in zip(text_xla + image_xla, text_ref + image_ref, strict=True):
        np.testing.assert_allclose(
            tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(), rtol=2e-3, atol=1e-5
        )


def test_xla_with_op_determinism_is_refused_with_the_layers_named(vocab_file, monkeypatch):
    """The demo's ResNet max-pools; with op determinism on, XLA cannot differentiate it (TensorFlow would fail at
    the first step with an error about a GPU kernel). compile says so, naming the layer and the two ways out."""
    from ce_retrieval.modeling import two_tower

    monkeypatch.setattr(two_tower, "_op_determinism_enabled", lambda: True)
    model = build_two_tower(tiny_config(), vocab_file)
    opts = {"text_optimizer": tf_keras.optimizers.SGD(0.1), "image_optimizer": tf_keras.optimizers.SGD(0.1)}
    with pytest.raises(ValueError, match=r"max-pooling layers \(.*pool.*\).*train.deterministic: false"):
        model.compile(loss=SampledSoftmax(), jit_compile=True, **opts)
    model.compile(loss=SampledSoftmax(), jit_compile=False, **opts)  # without XLA nothing to refuse
    frozen = build_two_tower(tiny_config(), vocab_file)
    frozen.image_core.trainable = False  # no gradient through a frozen tower's pools: nothing to refuse
    frozen.compile(loss=SampledSoftmax(), jit_compile=True, **opts)
    monkeypatch.setattr(two_tower, "_op_determinism_enabled", lambda: False)
    model.compile(loss=SampledSoftmax(), jit_compile=True, **opts)
