"""MirroredStrategy(2 logical CPUs) == one device: gathered similarity matrix and one training step.

Runs tests/modeling/mirrored_equivalence.py in a subprocess (logical devices must be set before any op runs).
Batch-norm statistics are synchronised across replicas (``batchnorm='sync'``), so one step on 2 x 4 rows must
update every weight (BN moving statistics included) exactly like one step on the 8 rows on one device; plain SGD
makes any wrong gradient scaling (e.g. a missing sum in all_gather's gradient) visible.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mirrored_equivalence.py")


@pytest.mark.slow
def test_mirrored_two_replicas_equal_one_device(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, SCRIPT, str(tmp_path), "sync"], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["shapes"] == [[8, 8], [8, 8]]  # each replica holds the GLOBAL matrix
    assert result["matrix_diff"] < 1e-5
    # float32 sums in another order across replicas: relative to the loss's size
    assert abs(result["loss_single"] - result["loss_multi"]) < 1e-5 * max(1.0, abs(result["loss_single"]))
    assert result["optimizer_iterations"] == [1, 1]
    assert result["step_size"] > 1e-3 and result["fraction_moved"] > 0.5  # the step really moved the weights
    assert result["weight_diff"] < 1e-5 * max(1.0, result["step_size"]), result["worst"]
