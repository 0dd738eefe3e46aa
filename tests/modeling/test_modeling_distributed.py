"""One TwoTowerModel training step under MirroredStrategy(2 logical CPUs) == the step on one device.

Runs tests/modeling/model_step_replicas.py once, in a subprocess (logical devices must be set before any op runs).
With batch norm synchronised across replicas (``batchnorm='sync'``), one step on 2 x 4 rows must update every weight
(BN moving statistics included) exactly like one step on the 8 rows on one device, on the ``replicated`` and the
``sharded`` loss paths; with frozen batch norm the gradient-cached step (``embedding_chunk``) must too. Plain SGD
makes any wrong gradient scaling (e.g. a missing sum in all_gather's gradient) visible.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_step_replicas.py")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    root = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    workdir = tmp_path_factory.mktemp("model_step_replicas")
    proc = subprocess.run([sys.executable, SCRIPT, str(workdir)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_same_step(part, names):
    """Every model in ``names`` took the one-device step: same weights, same logged loss, one optimizer step."""
    assert part["step_size"] > 1e-3 and part["fraction_moved"] > 0.5  # the step really moved the weights
    single = part["logged_loss"]["single"]
    for name in names:
        # float32 sums in another order across replicas: relative to the loss's and the step's size
        assert abs(part["logged_loss"][name] - single) < 1e-5 * max(1.0, abs(single)), (name, part["logged_loss"])
        assert part["weight_diff"][name] < 1e-5 * max(1.0, part["step_size"]), (name, part["weight_diff"])
        assert part["optimizer_iterations"][name] == [1, 1], name


@pytest.mark.slow
def test_mirrored_two_replicas_equal_one_device(result):
    sync = result["sync"]
    assert sync["shapes"] == [[8, 8], [8, 8]]  # each replica holds the GLOBAL matrix
    assert sync["matrix_diff"] < 1e-5
    _assert_same_step(sync, ["replicated"])


@pytest.mark.slow
def test_sharded_step_equals_the_replicated_step(result):
    """``train.loss_partition=sharded``: each replica computes the loss of its own rows against the gathered
    columns; the step is the replicated one (and so the one-device one)."""
    _assert_same_step(result["sync"], ["sharded"])


@pytest.mark.slow
def test_mirrored_cached_step_equals_the_plain_step(result):
    """Gradient caching under Mirrored(2), 4 rows per replica in chunks of 2, learned λ: the one-device plain step's
    update (which the plain replicated step equals: the test above)."""
    _assert_same_step(result["frozen"], ["cached"])
