"""``benchmarks/scale/replica_gather.py`` at the smallest size, in a fresh process (logical devices are set before
TensorFlow runs an op): the record holds both gathers, and the library's step has fewer all-gathers than the
former one (ids once, one offset for paired rows)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_the_benchmark_counts_fewer_all_gathers_for_the_library(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.scale.replica_gather", "--rows", "8", "--dim", "4", "--steps", "2"]
    done = subprocess.run(
        [*cmd, "--results", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "replica_gather.json").read_text())
    former, library = record["former"]["all_gathers"], record["library"]["all_gathers"]
    assert library < former, (library, former)
    assert (
        record["graph_ratio"] > 0
        and "| library (ids once, one offset) |" in (tmp_path / "replica_gather.md").read_text()
    )
