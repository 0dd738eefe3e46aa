"""``ce-retrieval export`` and the demo's export stage write the model's own scoring parameters: with
``model.learn_logit_scale`` the LEARNED λ (model.logit_scale), the same in both manifests, not the configured one."""

import math

import numpy as np
import pytest
import tensorflow as tf

from ce_retrieval import configs, modeling
from ce_retrieval.build.export import scoring_parameters
from ce_retrieval.cli import demo
from ce_retrieval.cli import main as cli_main
from ce_retrieval.configs.experiment import ExperimentConfig
from ce_retrieval.training import load_trained

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "circle", "blue", "square", "warm", "up"]
LEARNED = 3.25  # what training moved λ to; the config's initial λ stays 20


def _tiny_model_config():
    cfg = modeling.ModelConfig.tiny(embedding_dim=8, learn_logit_scale=True)
    cfg.text.hidden_size, cfg.text.num_layers, cfg.text.intermediate_size = 16, 1, 32
    cfg.image.image_size, cfg.image.stackwise_filters = 32, [4, 8]
    cfg.image.stackwise_blocks, cfg.image.stackwise_strides = [1, 1], [1, 2]
    return cfg


@pytest.fixture
def trained_dir(tmp_path):
    """A model directory as training leaves it (config.yaml, vocab.txt, checkpoints/latest) whose learned λ
    differs from the configured initial one."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    cfg = ExperimentConfig(model=_tiny_model_config())
    configs.save_yaml(cfg, str(model_dir / "config.yaml"))
    (model_dir / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    model = modeling.build_two_tower(cfg.model, str(model_dir / "vocab.txt"))
    model.text_encoder(tf.constant(["warm up"]))
    model.log_logit_scale.assign(math.log(LEARNED))
    tf.train.Checkpoint(model=model).save(str(model_dir / "checkpoints" / "latest" / "ckpt"))
    return str(model_dir)


def test_scoring_parameters_read_the_learned_logit_scale(trained_dir):
    cfg, model = load_trained(trained_dir)
    assert cfg.model.logit_scale == 20.0
    assert scoring_parameters(model) == pytest.approx({"logit_scale": LEARNED}, rel=1e-6)


def test_demo_and_export_write_the_same_learned_logit_scale(trained_dir, tmp_path, export_spy):
    """Both stages hand the learned λ to ``export_encoders``, the one writer of the manifests (``export_spy``: the
    SavedModels themselves are not written here, so the test is about the two callers, not about exporting)."""
    by_cli, by_demo = str(tmp_path / "export_cli"), str(tmp_path / "export_demo")
    assert cli_main(["export", "--model_dir", trained_dir, "--export_dir", by_cli, "--no_verify"]) == 0
    cfg, model = load_trained(trained_dir)
    demo.export_trained(cfg, model, by_demo)
    assert set(export_spy) == {by_cli, by_demo}
    scales = [export_spy[d]["logit_scale"] for d in (by_cli, by_demo)]
    np.testing.assert_allclose(scales, [LEARNED, LEARNED], rtol=1e-6)
    assert scales[0] == scales[1]
