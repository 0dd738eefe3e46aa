"""SigLIP through the config: the model owns t (λ) and the bias b, the loss gets them (or 1 and 0 when the model
learns them), errors name the keys, and a few steps on a tiny model train t, b and the towers."""

import dataclasses
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "modeling"))  # the modeling tests' helpers
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "losses"))  # the float64 references
import reference as ref  # noqa: E402
from modeling_fixtures import VOCAB, loss_cosine_relevance, make_batch, tiny_config  # noqa: E402

from ce_retrieval import configs, losses  # noqa: E402
from ce_retrieval.cli.train import resolve_config  # noqa: E402
from ce_retrieval.configs.experiment import ExperimentConfig, LossConfig  # noqa: E402
from ce_retrieval.modeling import ModelConfig, build_two_tower  # noqa: E402
from ce_retrieval.tasks import RetrievalTask, build_loss  # noqa: E402


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return str(path)


def _cfg(loss="SigmoidLoss", **model) -> ExperimentConfig:
    cfg = ExperimentConfig(name="siglip", model=tiny_config(**model), loss=LossConfig(name=loss))
    cfg.train = dataclasses.replace(cfg.train, batch_size=8, jit_compile=False)
    return cfg


def test_the_siglip_yaml_config_learns_t_and_b_from_the_demos_init():
    # t from the paper's 10, b from -5: the demo's SigLIP start, chosen on its validation split (the paper's -10
    # stalls at batch 64; benchmarks/results/demo_scale_siglip.md)
    cfg = configs.load_experiment(resolve_config("synthetic_siglip"))
    m = cfg.model
    assert (m.logit_scale, m.learn_logit_scale, m.logit_bias, m.learn_logit_bias) == (10.0, True, -5.0, True)
    loss = build_loss(cfg.loss, cfg.model)
    assert type(loss) is losses.SigmoidLoss and (loss.scale, loss.bias) == (10.0, -5.0)  # t₀, b₀: learned at call
    # the same through --params_override on the demo config
    demo = configs.load_experiment(
        resolve_config("synthetic_demo"),
        ["loss.name=sigmoid_loss", "model.logit_scale=10", "model.logit_bias=-10", "model.learn_logit_bias=true"],
    )
    loss = build_loss(demo.loss, demo.model)
    assert (loss.scale, loss.bias) == (10.0, -10.0)  # t₀ and b₀ whether learned or not


def test_the_siglip_yaml_config_is_the_demo_but_for_its_loss_and_logits():
    """Its header says everything but ``name``, ``model.logit_*`` and ``loss`` is the demo's: a default changed in
    one (e.g. the image warm-up) must be changed in the other."""
    siglip = configs.load_experiment(resolve_config("synthetic_siglip"))
    demo = configs.load_experiment(resolve_config("synthetic_demo"))
    assert (siglip.data, siglip.train, siglip.evaluation) == (demo.data, demo.train, demo.evaluation)
    assert (siglip.model.text, siglip.model.image, siglip.model.embedding_dim) == (
        demo.model.text,
        demo.model.image,
        demo.model.embedding_dim,
    )


@pytest.mark.parametrize(
    "model, scale, bias",
    [
        (dict(logit_scale=7.0, logit_bias=-3.0), 7.0, -3.0),  # both fixed
        (dict(logit_scale=7.0, logit_bias=-3.0, learn_logit_scale=True), 7.0, -3.0),  # t learned: t₀
        (dict(logit_scale=7.0, logit_bias=-3.0, learn_logit_bias=True), 7.0, -3.0),  # b learned: b₀
    ],
)
def test_the_loss_gets_t_and_b_from_the_model_config(model, scale, bias):
    loss = RetrievalTask(_cfg(**model)).build_loss()
    assert (loss.scale, loss.bias) == (scale, bias)


def test_errors_name_the_keys():
    with pytest.raises(ValueError, match=r"loss.kwargs.bias: the logit bias b has one home, model.logit_bias"):
        build_loss(LossConfig("SigmoidLoss", {"bias": -5.0}), tiny_config(logit_bias=-10.0))
    with pytest.raises(ValueError, match=r"loss.kwargs.scale: the logit scale λ has one home"):
        build_loss(LossConfig("SigmoidLoss", {"scale": 5.0}), tiny_config(logit_bias=-10.0))
    with pytest.raises(ValueError, match=r"SigmoidLoss adds a bias b .* model.logit_bias \(null here\)"):
        build_loss(LossConfig("SigmoidLoss"), tiny_config())
    with pytest.raises(ValueError, match=r"CrossExampleSoftmax has none \(losses with one: SigmoidLoss\)"):
        build_loss(LossConfig("CrossExampleSoftmax"), tiny_config(logit_bias=-10.0))
    with pytest.raises(ValueError, match=r"model.learn_logit_bias needs model.logit_bias"):
        ModelConfig(learn_logit_bias=True)
    with pytest.raises(ValueError, match=r"logit_bias must be a finite number"):
        ModelConfig(logit_bias=float("inf"))


@pytest.mark.slow
def test_the_model_refuses_a_loss_whose_bias_does_not_fit(vocab):
    opts = lambda: dict(text_optimizer=tf_keras.optimizers.Adam(), image_optimizer=tf_keras.optimizers.SGD())  # noqa: E731
    plain = build_two_tower(tiny_config(), vocab)
    with pytest.raises(ValueError, match="the model has none: give the model logit_bias"):
        plain.compile(loss=losses.SigmoidLoss(scale=20.0), **opts())
    fixed = build_two_tower(tiny_config(logit_scale=10.0, logit_bias=-10.0), vocab)
    assert float(fixed.logit_bias) == -10.0
    with pytest.raises(ValueError, match="logit bias mismatch"):
        fixed.compile(loss=losses.SigmoidLoss(scale=10.0, bias=-5.0), **opts())
    with pytest.raises(ValueError, match="only for a loss that declares one"):
        fixed.compile(loss=losses.SampledSoftmax(scale=10.0), **opts())
    learned = build_two_tower(tiny_config(logit_scale=10.0, logit_bias=-10.0, learn_logit_bias=True), vocab)
    with pytest.raises(ValueError, match="logit scale mismatch"):  # a learned b replaces the loss's; a fixed λ not
        learned.compile(loss=losses.SigmoidLoss(scale=1.0, bias=0.0), **opts())
    learned.compile(loss=losses.SigmoidLoss(scale=10.0, bias=3.0), **opts())  # b: replaced at every call
    assert plain.logit_bias is None
    tf_keras.backend.clear_session()


@pytest.mark.slow
def test_siglip_trains_t_b_and_the_towers_from_the_config(vocab):
    """The model's loss is SigLIP on its own t·cos + b (float64 reference), and 12 steps on one batch lower it
    while t and b, variables of the text optimizer, move and are logged."""
    cfg = _cfg(logit_scale=10.0, learn_logit_scale=True, logit_bias=-10.0, learn_logit_bias=True)
    model = RetrievalTask(cfg).build_compiled_model(vocab, total_steps=12)
    assert any(v is model.logit_bias_variable for v in model.text_variables)
    batch = make_batch()
    value, cosine, relevance = loss_cosine_relevance(model, batch)
    want = ref.sigmoid(relevance.numpy(), cosine.numpy().astype(np.float64), 10.0, -10.0)
    np.testing.assert_allclose(float(value), want, rtol=1e-5)

    history = model.fit(tf.data.Dataset.from_tensors(batch).repeat(), epochs=12, steps_per_epoch=1, verbose=0).history
    assert {"logit_scale", "logit_bias"} <= set(history)
    assert min(history["loss"][-3:]) < 0.9 * history["loss"][0], history["loss"]
    assert float(model.logit_scale) != pytest.approx(10.0, rel=1e-6)
    assert float(model.logit_bias) != pytest.approx(-10.0, rel=1e-6)
    tf_keras.backend.clear_session()


def test_the_demo_baseline_drops_the_bias_its_loss_does_not_have():
    from ce_retrieval.cli.demo import _baseline_model

    siglip = configs.load_experiment(resolve_config("synthetic_siglip")).model
    base = _baseline_model(siglip, "SampledSoftmax")
    assert (base.logit_bias, base.learn_logit_bias, base.learn_logit_scale) == (None, False, True)
    build_loss(LossConfig("SampledSoftmax"), base)  # accepted: no bias for a loss without one
    assert _baseline_model(siglip, "SigmoidLoss") is siglip


@pytest.mark.slow
def test_a_trained_siglip_model_exports_t_and_b(vocab, tmp_path, monkeypatch, export_spy):
    """``ce-retrieval export`` hands the model's learned t (logit_scale) and b (logit_bias) to ``export_encoders``,
    the one writer of the manifests (``export_spy``: the SavedModels themselves are not written here)."""
    import ce_retrieval.training
    from ce_retrieval import cli

    cfg = _cfg(logit_scale=10.0, learn_logit_scale=True, logit_bias=-10.0, learn_logit_bias=True)
    model = RetrievalTask(cfg).build_model(vocab)
    model.log_logit_scale.assign(np.log(12.5))
    model.logit_bias_variable.assign(-7.25)
    monkeypatch.setattr(ce_retrieval.training, "load_trained", lambda d: (cfg, model), raising=False)
    out = str(tmp_path / "export")
    assert cli.main(["export", "--model_dir", "run", "--export_dir", out, "--version", "1", "--no_verify"]) == 0
    assert list(export_spy) == [out]
    assert export_spy[out]["logit_scale"] == pytest.approx(12.5, rel=1e-6) and export_spy[out]["logit_bias"] == -7.25
    tf_keras.backend.clear_session()


def _siglip_tcm(**train):
    cfg = _cfg(logit_scale=10.0, learn_logit_scale=True, logit_bias=-10.0, learn_logit_bias=True)
    cfg.loss.regularizers = [configs.experiment.RegularizerConfig(weight=0.5)]
    cfg.train = dataclasses.replace(cfg.train, **train)
    return cfg


@pytest.mark.slow
def test_xla_step_equals_the_graph_step_with_learned_t_b_and_tcm(vocab):
    model = RetrievalTask(_siglip_tcm(jit_compile=True)).build_compiled_model(vocab, total_steps=5)
    inputs = model._prepare(make_batch(), augment=False)
    loss_xla, _, _, text_xla, image_xla = model._compute_gradients_jit(*inputs)
    loss_ref, _, _, text_ref, image_ref = tf.function(model._compute_gradients, autograph=False)(*inputs)
    np.testing.assert_allclose(float(loss_xla), float(loss_ref), rtol=1e-4)
    # the last two text variables are t' and b: their gradients come from the loss alone
    assert [v.name.split("/")[-1] for v in model.text_variables[-2:]] == ["log_logit_scale:0", "logit_bias:0"]
    assert all(abs(float(g)) > 0 for g in text_xla[-2:])
    for a, b in zip(text_xla + image_xla, text_ref + image_ref, strict=True):
        np.testing.assert_allclose(
            tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(), rtol=2e-3, atol=1e-5
        )
    tf_keras.backend.clear_session()


@pytest.mark.slow
def test_mixed_float16_step_and_checkpoint_keep_t_and_b(vocab, tmp_path):
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = RetrievalTask(_siglip_tcm()).build_compiled_model(vocab, total_steps=5)
        assert model.logit_bias_variable.dtype == tf.float32  # the variables stay float32 under the policy
        logs = model.train_on_batch(make_batch(), return_dict=True)
        assert np.isfinite(logs["loss"]) and np.isfinite(logs["logit_bias"]) and np.isfinite(logs["logit_scale"])
        # (the first float16 step is usually skipped by dynamic loss scaling, so move b by hand before saving)
        model.logit_bias_variable.assign(-7.25)
        path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
        again = RetrievalTask(_siglip_tcm()).build_model(vocab)
        tf.train.Checkpoint(model=again).restore(path).expect_partial()
        assert float(again.logit_bias) == -7.25
        assert float(again.logit_scale) == float(model.logit_scale)
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
        tf_keras.backend.clear_session()
