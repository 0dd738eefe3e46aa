"""The config chooses the objective's path (``train.loss_partition``, ``train.loss_tile_size``,
``train.embedding_chunk``): validated with clear errors, and a config-selected tiled step (with and without
gradient caching) computes the dense step's loss and gradients."""

import dataclasses
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "modeling"))  # the modeling tests' helpers
from modeling_fixtures import VOCAB, make_batch, tiny_config  # noqa: E402

from ce_retrieval.configs.experiment import ExperimentConfig, LossConfig  # noqa: E402
from ce_retrieval.tasks import RetrievalTask  # noqa: E402
from ce_retrieval.utils.dataclass_yaml import ConfigError, from_dict  # noqa: E402


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return str(path)


@pytest.mark.parametrize("value", [0, 3, 512, "auto"])
def test_tile_size_config_accepts(value):
    assert from_dict(ExperimentConfig, {"train": {"loss_tile_size": value}}).train.loss_tile_size == value


@pytest.mark.parametrize("value", [-1, "big", True, 2.5])
def test_tile_size_config_refuses(value):
    with pytest.raises(ConfigError, match="loss_tile_size"):
        from_dict(ExperimentConfig, {"train": {"loss_tile_size": value}})


def dense_array(gradient):
    """A gradient as a dense array (embedding tables' are ``IndexedSlices``)."""
    return tf.convert_to_tensor(gradient).numpy()


def _model(vocab, loss_name, **train):
    cfg = ExperimentConfig(name="objective", model=tiny_config(), loss=LossConfig(name=loss_name))
    cfg.model = dataclasses.replace(cfg.model, learn_logit_scale=True)
    cfg.model.image = dataclasses.replace(cfg.model.image, batchnorm="frozen")  # chunking is exact with frozen BN
    cfg.train = dataclasses.replace(cfg.train, batch_size=8, **train)
    model = RetrievalTask(cfg).build_compiled_model(vocab, total_steps=10)
    return model


@pytest.mark.slow
def test_config_selected_tiled_step_equals_the_dense_step(vocab):
    dense = _model(vocab, "CrossExampleNegativeMining")
    variants = {
        "tiled": _model(vocab, "CrossExampleNegativeMining", loss_tile_size=3),
        "tiled+cache": _model(vocab, "CrossExampleNegativeMining", loss_tile_size=3, embedding_chunk=4),
        "sharded+tiled": _model(vocab, "CrossExampleNegativeMining", loss_tile_size=3, loss_partition="sharded"),
    }
    assert variants["tiled"].objective.tile_for(8) == 3 and dense.objective.tile_for(8) == 0
    inputs = dense._prepare(make_batch(), augment=False)
    loss_d, recall_d, _, text_d, image_d = dense._compute_gradients(*inputs)
    for name, model in variants.items():
        model.set_weights(dense.get_weights())
        loss, recall, positive, text, image = model._compute_step(*inputs)
        np.testing.assert_allclose(float(loss), float(loss_d), rtol=1e-5, err_msg=name)
        assert float(recall) == float(recall_d) and bool(positive)
        for g, w in zip(text + image, text_d + image_d, strict=True):
            # float32 sums in another order: atol relative to the tensor's largest entry (an entry near zero of a
            # tensor of scale 5 differed by 5.7e-6 on an Intel Xeon, rel. 4e-4, and not on an AMD EPYC)
            w = dense_array(w)
            atol = 2e-6 * max(1.0, float(np.abs(w).max()))
            np.testing.assert_allclose(dense_array(g), w, rtol=2e-4, atol=atol, err_msg=name)
    assert abs(float(text_d[-1])) > 0  # the learned log λ has a gradient on every path


def test_config_refuses_a_tile_size_for_a_loss_without_a_tiled_path(vocab):
    with pytest.raises(ValueError, match=r"loss_tile_size=4 needs a loss with a tiled path; TripletLoss has none"):
        cfg = ExperimentConfig(name="objective", model=tiny_config(), loss=LossConfig(name="TripletLoss"))
        cfg.train = dataclasses.replace(cfg.train, batch_size=8, loss_tile_size=4)
        RetrievalTask(cfg).build_compiled_model(vocab, total_steps=10)


@pytest.mark.slow
def test_learned_lambda_keeps_its_checkpoint_name(vocab, tmp_path):
    """The objective uses the model's ``log_logit_scale`` variable, so checkpoints keep the key they had before the
    objective existed and restore into a fresh model."""
    model = _model(vocab, "CrossExampleSoftmax")
    assert [v is model.log_logit_scale for v in model.objective.trainable_variables] == [True]
    assert any(v is model.log_logit_scale for v in model.text_variables)
    model.log_logit_scale.assign(2.5)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    keys = [name for name, _ in tf.train.list_variables(path)]
    assert "model/log_logit_scale/.ATTRIBUTES/VARIABLE_VALUE" in keys
    fresh = _model(vocab, "CrossExampleSoftmax")
    tf.train.Checkpoint(model=fresh).restore(path).expect_partial()
    assert float(fresh.log_logit_scale) == pytest.approx(2.5)
    assert float(fresh.logit_scale) == pytest.approx(np.exp(2.5))
