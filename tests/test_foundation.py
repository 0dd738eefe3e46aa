"""The foundation: Keras mode, relevance from ids, the loss base-class contract and the CLI dispatcher."""
import numpy as np
import pytest
import tensorflow as tf

import ce_retrieval
from ce_retrieval import cli
from ce_retrieval.losses import RetrievalLoss, mean_over_positives, relevance_from_ids
from ce_retrieval.losses.registry import register


def test_legacy_keras_selected():
    assert tf.keras.layers.Dense.__module__.startswith("tf_keras")
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


@register
class _MeanPositiveScore(RetrievalLoss):
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


def test_replica_scaling_under_mirrored_strategy():
    devices = tf.config.list_logical_devices("CPU")
    strategy = tf.distribute.MirroredStrategy(devices[:1])  # one replica: value unchanged
    loss = _MeanPositiveScore()
    out = strategy.run(lambda: loss(tf.eye(2), tf.eye(2)))
    assert float(strategy.reduce("SUM", out, axis=None)) == pytest.approx(-1.0)


def test_cli_lists_commands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "demo" in capsys.readouterr().out
