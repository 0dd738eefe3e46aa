"""Behaviour: every loss of the softmax family trains the toy embedding of ``benchmarks/losses/toy_losses.py`` (recall@1
rises well above chance), and the script's command line runs it."""

import pytest
import tf_keras

from benchmarks.losses import toy_losses

FAMILY = [
    "SampledSoftmax",
    "StochasticNegativeMining",
    "CrossExampleSoftmax",
    "CrossExampleNegativeMining",
    "LargeMarginSoftmax",
    "AngularSoftmax",
    "AdditiveMarginSoftmax",
    "ArcMarginSoftmax",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILY)
def test_training_improves_recall_at_1(name):
    if name == "CrossExampleNegativeMining":
        # Mixed precision end to end: S arrives as float16, the loss computes in float32.
        tf_keras.mixed_precision.set_global_policy("mixed_float16")
    config = toy_losses.ToyConfig(steps=40, batch_size=32, learning_rate=1e-2, seed=0)  # chance = 1/16
    result = toy_losses.train_and_evaluate(name, config)
    assert result["recall_at_1_before"] < 0.15
    assert result["recall_at_1_after"] >= 0.25
    assert result["recall_at_1_after"] >= result["recall_at_1_before"] + 0.15


def test_cli_runs_and_rejects_unknown_losses(capsys):
    assert toy_losses.main(["--loss", "CrossExampleSoftmax", "--steps", "2", "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "| CrossExampleSoftmax |" in out and "recall@1 before" in out
    assert toy_losses.main(["--loss", "NoSuchLoss"]) == 2
    assert "unknown loss" in capsys.readouterr().out
    assert toy_losses.main(["--list"]) == 0
    assert "CrossExampleNegativeMining" in capsys.readouterr().out
