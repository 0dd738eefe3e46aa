"""ce_retrieval in fresh plain Keras 3 processes (``TF_USE_LEGACY_KERAS`` removed from their environment).

One process runs ``keras3_workflow.py`` (import order, training with CrossExampleSoftmax and TripletLoss,
``.keras`` round trip, replica scaling); the tests below read its JSON report. Another runs the README's Keras 3
example exactly as written.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
pytestmark = pytest.mark.slow


def run_keras3(args, timeout=300):
    """Runs ``python args...`` from the repository root without TF_USE_LEGACY_KERAS; returns the finished process."""
    env = {key: value for key, value in os.environ.items() if key != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def workflow():
    return json.loads(run_keras3([str(HERE / "keras3_workflow.py")]).stdout.strip().splitlines()[-1])


def test_import_after_tensorflow_keeps_keras3(workflow):
    assert workflow["legacy_env"] is None and workflow["legacy_env_after_import"] is None
    assert workflow["tf_keras_module"].startswith("keras.src.")  # tf.keras was Keras 3 before ce_retrieval ...
    assert workflow["tf_keras_after_import"].startswith("keras.src.")  # ... and still is after it
    assert workflow["tf_keras_losses"] >= 25


@pytest.mark.parametrize("loss", ["CrossExampleSoftmax", "TripletLoss"])
def test_two_input_model_trains(workflow, loss):
    report = workflow[loss]
    assert report["recall_after"] > report["recall_before"] + 0.3 and report["recall_after"] > 0.6, report
    assert report["loss_history"][-1] < report["loss_history"][0]


@pytest.mark.parametrize("loss", ["CrossExampleSoftmax", "TripletLoss"])
def test_keras_file_reloads_with_the_loss(workflow, loss):
    report = workflow[loss]
    assert report["reloaded_loss_class"] == f"ce_retrieval.keras.losses.{loss}"
    assert report["reloaded_loss_config_equal"]
    assert report["max_prediction_difference"] == 0.0
    assert report["evaluate"][0] == report["evaluate"][1]


def test_default_reduction_scales_for_replicas(workflow):
    plain = workflow["replicas_plain"]
    assert workflow["replicas_sum_over_batch_size"] == pytest.approx([plain / 2, plain / 2], rel=1e-6)
    assert workflow["replicas_sum"] == pytest.approx([plain, plain], rel=1e-6)


def readme_example():
    """The first python block of the README section "Use the loss in your own Keras model"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Use the loss in your own Keras model", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_readme_example_runs_in_a_fresh_keras3_process():
    code = readme_example()
    assert len(code.strip().splitlines()) <= 10
    done = run_keras3(["-c", code + "\nprint('history', model.history.history['loss'])"])
    assert re.search(r"history \[\d", done.stdout), done.stdout[-2000:]
