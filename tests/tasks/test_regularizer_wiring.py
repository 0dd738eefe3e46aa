"""``loss.regularizers``: Threshold-Consistent Margin (or another cosine regulariser) added to any loss from the
config, computed by the retrieval objective on cosines (never on λ·S + b), refused where it cannot be added."""

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
from ce_retrieval.configs import ConfigError  # noqa: E402
from ce_retrieval.configs.experiment import ExperimentConfig, LossConfig, RegularizerConfig  # noqa: E402
from ce_retrieval.modeling import OptimizerConfig  # noqa: E402
from ce_retrieval.tasks import RetrievalTask, build_regularizers  # noqa: E402

TCM = "ThresholdConsistentMargin"


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return str(path)


def _cfg(loss="SampledSoftmax", regularizers=(), **model) -> ExperimentConfig:
    cfg = ExperimentConfig(
        name="tcm", model=tiny_config(**model), loss=LossConfig(name=loss, regularizers=list(regularizers))
    )
    cfg.train = dataclasses.replace(cfg.train, batch_size=8, jit_compile=False)
    return cfg


def test_regularizers_from_yaml_overrides():
    cfg = configs.load_experiment(
        resolve_config("synthetic_demo"),
        ["loss.regularizers=[{name: ThresholdConsistentMargin, weight: 0.5, kwargs: {margin_plus: 0.8}}]"],
    )
    assert cfg.loss.name == "CrossExampleSoftmax"
    [(weight, term)] = build_regularizers(cfg.loss)
    assert weight == 0.5 and type(term) is losses.ThresholdConsistentMargin
    assert (term.margin_plus, term.margin_minus, term.weight_plus, term.weight_minus) == (0.8, 0.5, 1.0, 1.0)
    assert build_regularizers(LossConfig(regularizers=[RegularizerConfig()]))[0][1].get_config() == (
        losses.ThresholdConsistentMargin().get_config()
    )  # the entry's defaults: TCM with the paper's m⁺, m⁻, λ⁺, λ⁻ and weight 1


def test_bad_regularizers_are_named():
    with pytest.raises(ValueError, match=r"loss.regularizers\[0\]: .* CrossExampleSoftmax has a logit scale"):
        build_regularizers(LossConfig(regularizers=[RegularizerConfig(name="CrossExampleSoftmax")]))
    with pytest.raises(ValueError, match=r"loss.regularizers\[0\].kwargs: ThresholdConsistentMargin does not take m"):
        build_regularizers(LossConfig(regularizers=[RegularizerConfig(kwargs={"m": 0.1})]))
    with pytest.raises(ConfigError, match="weight must be >= 0"):
        configs.load_experiment(resolve_config("synthetic_demo"), ["loss.regularizers=[{weight: -1}]"])
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        build_regularizers(LossConfig(regularizers=[RegularizerConfig(name="nope")]))


@pytest.mark.parametrize(
    "loss, model",
    [
        ("SampledSoftmax", dict(learn_logit_scale=True)),  # the loss folds a learned λ into S
        ("SigmoidLoss", dict(logit_scale=10.0, learn_logit_scale=True, logit_bias=-10.0, learn_logit_bias=True)),
        ("CrossExampleSoftmax", {}),  # fixed λ: the loss applies it
    ],
)
def test_tcm_sees_cosines_whatever_the_model_does_to_the_logits(vocab, loss, model):
    """L = loss(R, logits) + w · TCM(R, cos), TCM from the float64 reference on the model's cosines."""
    cfg = _cfg(loss, [RegularizerConfig(weight=0.7)], **model)
    task = RetrievalTask(cfg)
    compiled = task.build_compiled_model(vocab, total_steps=5)
    value, cosine, relevance = loss_cosine_relevance(compiled, make_batch())
    plain = float(compiled.retrieval_loss.call(relevance, cosine, **compiled.objective.loss_scalars()))
    tcm = ref.threshold_consistent_margin(relevance.numpy(), cosine.numpy().astype(np.float64))
    assert tcm > 0.05  # the term is there to be seen
    np.testing.assert_allclose(float(value), plain + 0.7 * tcm, rtol=1e-5)
    assert "0.7·ThresholdConsistentMargin on cosines" in task.describe(compiled, tf.distribute.get_strategy())
    tf_keras.backend.clear_session()


def test_sharded_partition_refuses_regularizers(vocab):
    cfg = _cfg("SampledSoftmax", [RegularizerConfig()])
    cfg.train = dataclasses.replace(cfg.train, loss_partition="sharded")
    with pytest.raises(ValueError, match="loss_partition='replicated'"):
        RetrievalTask(cfg).build_compiled_model(vocab, total_steps=5)
    tf_keras.backend.clear_session()


def _tcm_after_training(vocab, regularizers, steps=12):
    """(TCM of the batch's cosines before, after ``steps`` steps on that batch, the training losses)."""
    tf_keras.utils.set_random_seed(0)  # the same initial towers for every call
    cfg = _cfg("SampledSoftmax", regularizers)
    cfg.train = dataclasses.replace(cfg.train, optimizer=OptimizerConfig.tiny(text_warmup_steps=0))
    model = RetrievalTask(cfg).build_compiled_model(vocab, total_steps=steps)
    batch = make_batch()

    def tcm_now():
        _, cosine, relevance = loss_cosine_relevance(model, batch)
        return ref.threshold_consistent_margin(relevance.numpy(), cosine.numpy().astype(np.float64))

    before = tcm_now()
    dataset = tf.data.Dataset.from_tensors(batch).repeat()
    history = model.fit(dataset, epochs=steps, steps_per_epoch=1, verbose=0).history
    after = tcm_now()
    tf_keras.backend.clear_session()
    return before, after, history["loss"]


@pytest.mark.slow
def test_training_with_tcm_lowers_the_threshold_inconsistency(vocab):
    """Paired: the same towers trained on the same batch by SampledSoftmax alone and + 2·TCM; the TCM of the
    batch's cosines ends lower with the regulariser, and the regularised objective falls."""
    before, plain, _ = _tcm_after_training(vocab, [])
    same_before, regularised, history = _tcm_after_training(vocab, [RegularizerConfig(weight=2.0)])
    assert same_before == pytest.approx(before, rel=1e-6)
    assert regularised < plain, (before, plain, regularised)
    assert min(history[-3:]) < history[0], history
