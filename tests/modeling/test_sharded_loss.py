"""The loss sharded over replicas (``ce_retrieval.losses.kernels.sharded``, ``train.loss_partition=sharded``).

Multi-replica checks run tests/modeling/sharded_equivalence.py in two subprocesses started together (2 and 4
logical CPUs; logical devices must be set before any op runs): for the four softmax-family losses (mining by
fraction and by top_k), the replicas' shares sum to the one-device loss and their gradients (w.r.t. the scores,
with many ties; w.r.t. the embeddings through all_gather and w.r.t. shared weights, summed over replicas) equal
the one-device gradients; rows with two positives (two captions of one image) inside and across replicas. With 2
replicas, one TwoTowerModel step ``sharded`` equals the ``replicated`` step (weights and logged loss); the same
with gradient caching is ``python tests/modeling/sharded_equivalence.py DIR 4 chunk`` (not run here: model builds
dominate the run time).
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from modeling_fixtures import tiny_config

from ce_retrieval.configs.experiment import TrainConfig
from ce_retrieval.losses import (
    CrossExampleNegativeMining,
    CrossExampleSoftmax,
    SampledSoftmax,
    StochasticNegativeMining,
    relevance_from_ids,
)
from ce_retrieval.losses.kernels.sharded import sharded_softmax_loss
from ce_retrieval.losses.kernels.softmax import softmax_loss

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharded_equivalence.py")
REPLICA_COUNTS = (2, 4)
MODEL_STEP = 2  # the process that also checks a model step (model builds dominate the run time)


@pytest.fixture(scope="module")
def distributed_results(tmp_path_factory):
    """Both subprocesses, run concurrently (graph building is mostly single-threaded)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = {}
    for replicas in REPLICA_COUNTS:
        workdir = tmp_path_factory.mktemp(f"sharded{replicas}")
        procs[replicas] = subprocess.Popen(
            [sys.executable, SCRIPT, str(workdir), str(replicas)] + (["model"] if replicas == MODEL_STEP else []),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    results = {}
    for replicas, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        results[replicas] = (proc.returncode, stdout, stderr)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("replicas", REPLICA_COUNTS)
def test_sharded_shares_sum_to_global_loss_and_gradient(distributed_results, replicas):
    returncode, stdout, stderr = distributed_results[replicas]
    assert returncode == 0, stderr[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["replicas"] == replicas
    assert len(result["losses"]) == 6
    for name, diffs in result["losses"].items():  # relative differences: float32 sums in another order
        for key, value in diffs.items():
            assert value < 1e-5, (name, key, value)  # float32 rounding at λ = 20 (measured <= 2e-6)
    if replicas != MODEL_STEP:
        return
    model = result["model"]
    assert model["step_size"] > 1e-3  # the step really moved the weights
    for name, diff in model["weight_diff"].items():
        assert diff < 1e-5 * max(1.0, model["step_size"]), (name, diff)
    logged = model["logged_loss"]
    for name, value in logged.items():  # the logged loss is the global loss in both modes
        assert abs(value - logged["replicated"]) < 1e-5 * max(1.0, abs(logged["replicated"])), (name, logged)


@pytest.mark.parametrize("cross_example", [False, True])
@pytest.mark.parametrize("mining", [{}, {"negative_fraction": 0.5}, {"top_k": 3}])
def test_sharded_loss_is_dense_loss_outside_replica_context(cross_example, mining):
    rng = np.random.default_rng(0)
    ids = tf.constant([0, 0, 1, 2, 3, 4, 5, 5], tf.int64)
    scores = tf.constant(np.round(rng.uniform(-1, 1, (8, 8)) * 4) / 4, tf.float32)  # ties
    relevance = relevance_from_ids(ids, ids)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(scores)
        sharded = sharded_softmax_loss(relevance, scores, 20.0, cross_example, **mining)
        dense = softmax_loss(relevance, scores, 20.0, cross_example, **mining)
    np.testing.assert_allclose(sharded.numpy(), dense.numpy(), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(sharded, scores), tape.gradient(dense, scores), rtol=1e-5, atol=1e-7)


def test_sharded_loss_traces_under_tf_function():
    fn = tf.function(lambda r, s: sharded_softmax_loss(r, s, 20.0, True, negative_fraction=0.5))
    relevance = relevance_from_ids(tf.range(6), tf.range(6))
    scores = tf.random.stateless_uniform([6, 6], [1, 2], -1, 1)
    expected = softmax_loss(relevance, scores, 20.0, True, negative_fraction=0.5)
    np.testing.assert_allclose(fn(relevance, scores).numpy(), expected.numpy(), rtol=1e-6)


def _compile(model, loss, partition):
    model.compile(
        loss=loss,
        text_optimizer=tf_keras.optimizers.SGD(0.1),
        image_optimizer=tf_keras.optimizers.SGD(0.1),
        loss_partition=partition,
    )


def test_loss_partition_refuses_unsupported_losses(vocab_file):
    """The objective shards every loss that ``supports_sharded`` (the softmax family, margins and ``bidirectional``
    included) and refuses the others, naming the alternatives."""
    from ce_retrieval.losses import AdditiveMarginSoftmax, NPairLoss
    from ce_retrieval.modeling import build_two_tower

    model = build_two_tower(tiny_config(), vocab_file)
    for supported in (
        SampledSoftmax(),
        StochasticNegativeMining(),
        CrossExampleSoftmax(),
        CrossExampleNegativeMining(),
        AdditiveMarginSoftmax(scale=20.0),
        CrossExampleSoftmax(bidirectional=True),
    ):
        _compile(model, supported, "sharded")
        assert model.loss_partition == "sharded"
    with pytest.raises(ValueError, match=r"NPairLoss cannot \(losses that can: .*CrossExampleSoftmax.*replicated"):
        _compile(model, NPairLoss(scale=20.0), "sharded")
    with pytest.raises(ValueError, match="loss_partition must be one of"):
        _compile(model, SampledSoftmax(), "local")


def test_train_config_loss_partition():
    assert TrainConfig().loss_partition == "replicated"
    assert TrainConfig(loss_partition="sharded").loss_partition == "sharded"
    with pytest.raises(ValueError, match="train.loss_partition"):
        TrainConfig(loss_partition="local")


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
def test_sharded_cross_example_under_multi_worker_mirrored():
    """2 workers on 127.0.0.1 (TF_CONFIG, one CPU replica each): CE and CENM shares sum to L, gradients equal."""
    script = os.path.join(os.path.dirname(SCRIPT), "sharded_multiworker.py")
    root = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("TF_CONFIG", None)
    ports = ",".join(map(str, _free_ports(2)))
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(i), ports], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for i in range(2)
    ]
    try:
        outputs = [proc.communicate(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, stderr[-3000:]
        result = json.loads(stdout.strip().splitlines()[-1])
        assert result["replicas"] == 2
        for name in ("CrossExampleSoftmax", "CrossExampleNegativeMining"):
            for key, value in result[name].items():
                assert value < 1e-5, (result["worker"], name, key, value)  # float32, λ = 20
