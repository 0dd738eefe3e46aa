"""The command line drops TensorFlow's cuInit failure line on a CPU-only machine, and only that line."""

import os
import subprocess
import sys
import textwrap

import pytest

from ce_retrieval.utils import cuda_probe


def test_noise_pattern_matches_only_the_cuinit_failure():
    line = (
        b"2026-11-23 16:54:05.641329: E external/local_xla/xla/stream_executor/cuda/cuda_platform.cc:51] "
        b"failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n"
    )
    assert cuda_probe.NOISE.search(line)
    for other in (
        b"2026-11-23 16:54:05: E tensorflow/core/framework/op_kernel.cc:1] OP_REQUIRES failed: NaN in input\n",
        b"W external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:10] out of memory\n",
        b"Traceback (most recent call last):\n",
    ):
        assert not cuda_probe.NOISE.search(other)


@pytest.mark.slow
@pytest.mark.skipif(cuda_probe.nvidia_driver_present(), reason="only CPU-only machines drop the line")
def test_probe_drops_the_cuinit_line_and_keeps_everything_else():
    # A child process: the probe must run before TensorFlow's first device query, and it captures fd 2.
    script = textwrap.dedent(
        """
        import os, sys
        from ce_retrieval.utils import cuda_probe
        import tensorflow as tf
        real = tf.config.list_physical_devices
        def noisy():  # what else TensorFlow might print in the window must still come through
            os.write(2, b"E something that matters\\n")
            return real()
        tf.config.list_physical_devices = noisy
        dropped = cuda_probe.probe_devices_quietly()
        print(len(dropped), file=sys.stderr)
        tf.constant(1.0) + 1.0
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, env=env, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "cuInit" not in err
    assert "E something that matters" in err
    assert err.strip().splitlines()[-1] in {"0", "1"}  # a CPU build of TensorFlow prints no cuInit line at all
