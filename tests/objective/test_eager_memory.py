"""The tiled path's memory is O(N·T + (N + M)·d) eagerly too: under an eager GradientTape at N = M = 16,384 the
dense ``[N, N]`` float32 matrix alone is 1 GiB (and its eager backward keeps several); the tiled step must grow the
peak RSS by well under that (measured 0.30 GiB; 7.5 GiB before the tiled op was cut off the eager tape).
SigLIP's tiled path likewise (its backward recomputes each tile's logits). Measured in a fresh process (peak RSS
only grows)."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eager_memory.py")
N = 16384
DENSE_MATRIX_GIB = 4 * N * N / 2**30  # 1 GiB


@pytest.mark.slow
@pytest.mark.parametrize("which", ["softmax", "siglip"])
def test_eager_tiled_step_stays_far_below_one_dense_matrix(which):
    root = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, SCRIPT, str(N), which], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["value"] > 0
    assert result["growth_gib"] < 0.6 * DENSE_MATRIX_GIB, result
