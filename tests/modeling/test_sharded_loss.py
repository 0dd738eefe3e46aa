"""The loss sharded over replicas (``ce_retrieval.losses.kernels.sharded``, ``train.loss_partition=sharded``).

Its multi-replica checks (2 and 4 logical CPUs: Σ shares = the one-device loss and equal gradients for the four
softmax-family losses, and one TwoTowerModel step ``sharded`` == ``replicated``) run in the objective's replica
harness, each computed once: tests/objective/test_objective_replicas.py. Here: the sharded loss outside a replica
context, under tf.function, the refusals, and the multi-worker run.
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

HERE = os.path.dirname(os.path.abspath(__file__))


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
    script = os.path.join(HERE, "sharded_multiworker.py")
    root = os.path.dirname(os.path.dirname(HERE))
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
