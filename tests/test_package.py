"""The foundation: Keras mode, relevance from ids, the loss base-class contract and the CLI dispatcher."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import ce_retrieval
from ce_retrieval import cli
from ce_retrieval.losses import RetrievalLoss, mean_over_positives, relevance_from_ids


def test_legacy_keras_selected():
    assert tf_keras.layers.Dense.__module__.startswith("tf_keras")
    assert ce_retrieval.__version__


def test_relevance_from_ids_several_captions_per_image():
    r = relevance_from_ids([7, 7, 3], [3, 7, 9]).numpy()
    np.testing.assert_array_equal(r, [[0, 1, 0], [0, 1, 0], [1, 0, 0]])


def test_relevance_from_ids_exclude_self_marks_diagonal_ignored():
    r = relevance_from_ids(tf.constant([1, 1, 2]), tf.constant([1, 1, 2]), exclude_self=True).numpy()
    np.testing.assert_array_equal(r, [[-1, 1, 0], [1, -1, 0], [0, 0, -1]])


def test_relevance_from_ids_rejects_bad_shapes():
    with pytest.raises(ValueError, match="rank-1"):
        relevance_from_ids([[1]], [1])


class _MeanPositiveScore(RetrievalLoss):  # not registered: a toy must not enter the global registry
    """Toy loss for contract tests: minus the mean positive score."""

    def compute(self, relevance, scores):
        return -mean_over_positives(scores, relevance)


def test_base_validation_messages():
    loss = _MeanPositiveScore()
    s = tf.constant([[0.5, 0.1], [0.2, 0.9]])
    assert float(loss(tf.eye(2), s)) == pytest.approx(-0.7)
    with pytest.raises(ValueError, match="rank-2"):
        loss(tf.ones([2]), tf.ones([2]))
    with pytest.raises(ValueError, match="does not match"):
        loss(tf.eye(2), tf.ones([2, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="no positive pair"):
        loss(tf.zeros([2, 2]), s)
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        loss(2 * tf.eye(2), s)
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf"):
        loss(tf.eye(2), tf.constant([[np.nan, 0.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="sample_weight"):
        loss(tf.eye(2), s, sample_weight=tf.ones([2]))


def test_base_validation_inside_tf_function():
    loss = _MeanPositiveScore()
    f = tf.function(lambda y, s: loss(y, s))
    with pytest.raises(tf.errors.InvalidArgumentError, match="no positive pair"):
        f(tf.zeros([2, 2]), tf.ones([2, 2]))


def test_bidirectional_and_mixed_precision_inputs():
    s = np.array([[0.5, 0.1, 0.3], [0.2, 0.9, 0.4]], np.float32)
    y = np.array([[1, 0, 1], [0, 1, 0]], np.float32)
    both = _MeanPositiveScore(bidirectional=True)
    assert float(both(y, tf.constant(s, tf.float16))) == pytest.approx(-(0.5 + 0.3 + 0.9) / 3, abs=1e-3)
    restored = _MeanPositiveScore.from_config(both.get_config())
    assert restored.bidirectional and restored.name == both.name


_TWO_REPLICAS = r"""
import json, os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
import tf_keras
import ce_retrieval
from tf_keras.src.engine.compile_utils import LossesContainer
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from ce_retrieval.losses import CrossExampleSoftmax
s = tf.constant(np.random.default_rng(0).normal(size=(4, 4)), tf.float32)
y = tf.eye(4)
whole = float(CrossExampleSoftmax(scale=5.0)(y, s))
strategy = tf.distribute.MirroredStrategy(tf.config.list_logical_devices("CPU")[:2])
with strategy.scope():
    summed_loss = CrossExampleSoftmax(scale=5.0, reduction="sum")
    compiled = LossesContainer(CrossExampleSoftmax(scale=5.0))  # what model.compile(loss=...) wraps
    auto_loss = CrossExampleSoftmax(scale=5.0)
def step():
    with tf.GradientTape() as tape:
        tape.watch(s)
        value = summed_loss(y, s)
    return value, tape.gradient(value, s), compiled(y, s)
values, grads, compiled_values = strategy.run(step)
try:
    strategy.run(lambda: auto_loss(y, s))
    refused = ""
except ValueError as e:
    refused = str(e)
with tf.GradientTape() as tape:
    tape.watch(s)
    reference = CrossExampleSoftmax(scale=5.0)(y, s)
print(json.dumps({"replicas": strategy.num_replicas_in_sync, "whole": whole,
                  "per_replica": [float(v) for v in strategy.experimental_local_results(values)],
                  "compiled": [float(v) for v in strategy.experimental_local_results(compiled_values)],
                  "refused": refused,
                  "grad_error": float(tf.reduce_max(tf.abs(strategy.reduce("SUM", grads, axis=None)
                                                           - 2 * tape.gradient(reference, s))))}))
"""


@pytest.mark.slow
def test_losses_leave_replica_scaling_to_the_step_and_to_keras():
    """Under a 2-replica strategy a loss returns the objective of the matrix it is given (reduction='sum': L on
    every replica, gradients summing to 2 dL/dS: the caller scales); inside ``model.compile`` Keras divides it by
    the replica count itself (L / 2 each); a custom loop with the default reduction gets Keras's own refusal."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TWO_REPLICAS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["replicas"] == 2
    assert out["per_replica"] == pytest.approx([out["whole"]] * 2, rel=1e-6)
    assert out["compiled"] == pytest.approx([out["whole"] / 2] * 2, rel=1e-6)
    assert "reduction" in out["refused"].lower()
    assert out["grad_error"] < 1e-5


def test_cli_lists_commands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "demo" in capsys.readouterr().out


def test_test_file_basenames_are_unique():
    """pytest imports test files by basename (rootdir-relative, no packages): two ``test_x.py`` in different folders
    make one of them an "import file mismatch" collection error, which has happened when files moved."""
    import collections
    import pathlib

    names = collections.Counter(p.name for p in pathlib.Path(__file__).parent.rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1], names.most_common(3)
