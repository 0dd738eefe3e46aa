"""Every registered loss, selected by name through the experiment config, trains the two-tower model.

The contract of the retrieval task (``ce_retrieval.tasks``): one short step per loss on a tiny model, built the way
``ce-retrieval train`` builds it (config → task → loss with λ from ``model.logit_scale`` → compiled model).
"""

import dataclasses
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "modeling"))  # the modeling tests' helpers
from modeling_fixtures import VOCAB, make_batch, tiny_config  # noqa: E402

from ce_retrieval import configs, losses
from ce_retrieval.configs.experiment import ExperimentConfig, LossConfig
from ce_retrieval.tasks import RetrievalTask


@pytest.fixture(scope="module")
def task_vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return str(path)


def _experiment(loss_name: str, **loss_kwargs) -> ExperimentConfig:
    # a loss with a logit bias (SigLIP) takes b from model.logit_bias, which must then be set
    bias = -10.0 if losses.lookup(loss_name).has_logit_bias else None
    model = tiny_config(logit_bias=bias)
    cfg = ExperimentConfig(name="every_loss", model=model, loss=LossConfig(name=loss_name, kwargs=loss_kwargs))
    cfg.train = dataclasses.replace(cfg.train, batch_size=8, jit_compile=False)
    return cfg


@pytest.fixture(scope="module")
def built_model(task_vocab_file):
    """The task's uncompiled model for a model config, built once per config and handed back with its initial
    weights: building the towers costs three times the step, and the model does not depend on the loss (which
    ``build_compiled_model`` builds and compiles for each test, as ``ce-retrieval train`` does)."""
    cache = {}

    def get(task):
        key = repr(task.config.model)
        if key not in cache:
            model = RetrievalTask.build_model(task, task_vocab_file)  # the method (the test replaces the attribute)
            cache[key] = (model, [(v, v.numpy()) for v in model.weights])
        model, initial = cache[key]
        for variable, value in initial:
            variable.assign(value)
        return model

    return get


@pytest.mark.parametrize("name", losses.available())
def test_every_registered_loss_trains_the_two_tower_model(name, task_vocab_file, built_model):
    cfg = _experiment(name)
    task = RetrievalTask(cfg)
    task.build_model = lambda vocab_path: built_model(task)  # the towers for this model config, as first built
    model = task.build_compiled_model(task_vocab_file, total_steps=10)
    model.run_eagerly = True  # one step: tracing the towers would cost more than the step (graph/XLA: test_contract)
    loss = model.retrieval_loss
    assert type(loss) is losses.lookup(name)
    if loss.has_logit_scale:
        assert loss.logit_scale == pytest.approx(cfg.model.logit_scale)
    else:
        assert loss.logit_scale is None
    batch = make_batch()
    before = [v.numpy().copy() for v in model.trainable_variables]
    logs = model.train_on_batch(batch, return_dict=True)
    assert np.isfinite(logs["loss"]), f"{name}: loss {logs['loss']}"
    moved = [not np.allclose(a, v.numpy()) for a, v in zip(before, model.trainable_variables, strict=True)]
    assert any(moved), f"{name}: one step changed no weight"


def test_lambda_lives_in_the_model_config_only():
    with pytest.raises(ValueError, match=r"loss.kwargs.scale: the logit scale λ has one home, model.logit_scale"):
        RetrievalTask(_experiment("CrossExampleSoftmax", scale=20.0)).build_loss()
    with pytest.raises(ValueError, match=r"loss.kwargs.temperature"):
        RetrievalTask(_experiment("InfoNCE", temperature=0.05)).build_loss()


def test_a_key_the_loss_does_not_take_is_named_with_what_it_takes():
    with pytest.raises(ValueError, match=r"TripletLoss does not take negative_fraction; it takes .*margin"):
        RetrievalTask(_experiment("TripletLoss", negative_fraction=0.5)).build_loss()


@pytest.mark.parametrize(
    "name, key, expected",
    [("CrossExampleSoftmax", "scale", 7.0), ("InfoNCE", "temperature", 1 / 7.0), ("NCALoss", "scale", 3.5)],
)
def test_each_loss_gets_lambda_in_its_own_parametrisation(name, key, expected):
    cfg = _experiment(name)
    cfg.model = dataclasses.replace(cfg.model, logit_scale=7.0)
    loss = RetrievalTask(cfg).build_loss()
    assert getattr(loss, key) == pytest.approx(expected)
    assert loss.logit_scale == pytest.approx(7.0)


def test_learned_lambda_gives_the_loss_its_start_and_needs_a_logit_scale():
    cfg = _experiment("SampledSoftmax")
    cfg.model = dataclasses.replace(cfg.model, logit_scale=7.0, learn_logit_scale=True)
    assert RetrievalTask(cfg).build_loss().logit_scale == pytest.approx(7.0)  # λ₀; the objective gives it λ
    cfg.loss = LossConfig(name="TripletLoss")
    with pytest.raises(ValueError, match="TripletLoss has none"):
        RetrievalTask(cfg).build_loss()


def test_soft_triple_in_the_two_tower_model_has_one_centre_per_image():
    assert RetrievalTask(_experiment("SoftTripleLoss")).build_loss().proxies_per_class == 1
    with pytest.raises(ValueError, match="proxies_per_class=1"):
        RetrievalTask(_experiment("SoftTripleLoss", proxies_per_class=10)).build_loss()


def test_params_override_selects_a_loss_by_name():
    cfg = configs.load_experiment(_demo_yaml(), ["loss.name=TripletLoss"])
    loss = RetrievalTask(cfg).build_loss()
    assert type(loss).__name__ == "TripletLoss" and loss.logit_scale is None


def _demo_yaml() -> str:
    import pathlib

    return str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "synthetic_demo.yaml")


def test_the_model_refuses_a_loss_with_another_lambda(task_vocab_file):
    cfg = _experiment("SampledSoftmax")
    task = RetrievalTask(cfg)
    model = task.build_model(task_vocab_file)
    text_opt, image_opt = task.build_optimizers(10)
    with pytest.raises(ValueError, match="logit scale mismatch"):
        model.compile(loss=losses.SampledSoftmax(scale=10.0), text_optimizer=text_opt, image_optimizer=image_opt)
    with pytest.raises(TypeError, match="pass a loss instance"):
        model.compile(loss="sampled_softmax", text_optimizer=text_opt, image_optimizer=image_opt)
    tf_keras.backend.clear_session()


def _poisoned(task_vocab_file, jit: bool, policy: str, on_bad_batch: str, chunk: int = 0):
    """A compiled model whose text projection holds a NaN: every score of the next step is NaN. ``chunk``: gradient
    caching (``train.embedding_chunk``), whose step computes the loss and gradients another way."""
    tf_keras.mixed_precision.set_global_policy(policy)
    cfg = _experiment("CrossExampleNegativeMining")
    cfg.train = dataclasses.replace(
        cfg.train, jit_compile=jit, on_bad_batch=on_bad_batch, embedding_chunk=chunk or None
    )
    model = RetrievalTask(cfg).build_compiled_model(task_vocab_file, total_steps=10)
    kernel = next(v for v in model.text_variables if v.shape.rank == 2 and "projection" in v.name)
    poisoned = kernel.numpy()
    poisoned[0, 0] = np.nan
    kernel.assign(poisoned)
    return model


@pytest.mark.slow
@pytest.mark.parametrize(
    "jit, policy, chunk",
    [(True, "float32", 4), (False, "float32", 0), (True, "mixed_float16", 0)],
    ids=["xla-cached", "graph", "xla-mixed_float16"],
)
def test_a_nan_step_stops_training_with_an_error_naming_the_step(task_vocab_file, jit, policy, chunk):
    """Under XLA with and without gradient caching (chunks of 4 rows), in a graph, in mixed precision."""
    model = _poisoned(task_vocab_file, jit, policy, "stop", chunk)
    assert model.embedding_chunk == chunk
    image_before = [v.numpy().copy() for v in model.image_variables]
    # Under XLA the loss's own NaN check is compiled away: the step's flag check is what stops it.
    expected = r"training step.*has a NaN or Inf loss or gradient" if jit else r"NaN or Inf"
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected):
        model.train_on_batch(make_batch())
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(image_before, model.image_variables, strict=True))


@pytest.mark.slow
def test_skip_leaves_the_weights_and_counts_the_step(task_vocab_file):
    """Under XLA with gradient caching (chunks of 4 rows)."""
    model = _poisoned(task_vocab_file, True, "float32", "skip", chunk=4)
    assert model.embedding_chunk == 4
    image_before = [v.numpy().copy() for v in model.image_variables]
    logs = model.train_on_batch(make_batch(), return_dict=True)
    assert int(logs["skipped_steps"]) == 1
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(image_before, model.image_variables, strict=True))
    assert int(model.image_optimizer.iterations.numpy()) == 0
