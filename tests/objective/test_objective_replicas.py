"""The objective under 2 replicas (MirroredStrategy on logical CPUs, in a subprocess: objective_replicas.py) equals
one device: for every registered loss on the replicated dense path, and for the softmax family on the tiled,
sharded and sharded + tiled paths (bidirectional and learned λ included): Σ_r share_r = L and the replicas'
gradients (embeddings through all_gather, λ summed over replicas) = dL/d(·) on one device."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "objective_replicas.py")


@pytest.mark.slow
def test_every_path_under_two_replicas_equals_one_device():
    root = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, SCRIPT, "2"], capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert len(result["results"]) > 40
    for name, diffs in result["results"].items():
        for key, value in diffs.items():
            assert value < 2e-5, (name, key, value)  # float32 sums in another order
