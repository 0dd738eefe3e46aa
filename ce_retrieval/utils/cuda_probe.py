"""Silences exactly one known line: TensorFlow's CUDA probe failing on a machine without an NVIDIA driver.

At its first device query a CUDA build of TensorFlow initialises the CUDA platform, and on a CPU-only machine XLA's
C++ logger prints ``failed call to cuInit: ... (303)`` at ERROR level, before any user code can react. It is noise
there (nothing asked for a GPU), but ``TF_CPP_MIN_LOG_LEVEL=3`` would hide every other C++ error too, and no
narrower setting exists. So the command line, and only on a machine with no NVIDIA driver (no ``/dev/nvidiactl``,
no ``/proc/driver/nvidia``), runs that first query itself with file descriptor 2 captured, then writes back every
captured line except the cuInit one. Anything else printed in that window (a real error) still reaches stderr.
On a machine with a driver nothing is captured: a failing cuInit there is a real problem and stays visible.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

#: The known noise: XLA's CUDA platform reporting that cuInit failed.
NOISE = re.compile(rb"cuda_platform\.cc:\d+\] failed call to cuInit|failed call to cuInit: .*(303|NO_DEVICE)")


def nvidia_driver_present() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia")


@contextlib.contextmanager
def _captured_stderr_fd():
    """Yields a list that, after the block, holds everything written to file descriptor 2 inside it (bytes)."""
    captured: list[bytes] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read())


def probe_devices_quietly() -> list[bytes]:
    """Initialises TensorFlow's devices with the cuInit noise dropped (no-op with an NVIDIA driver present).
    Returns the lines that were dropped."""
    if nvidia_driver_present():
        return []
    with _captured_stderr_fd() as captured:
        import tensorflow as tf

        tf.config.list_physical_devices()
    dropped, kept = [], []
    for line in b"".join(captured).splitlines(keepends=True):
        (dropped if NOISE.search(line) else kept).append(line)
    if kept:
        os.write(2, b"".join(kept))
    return dropped


__all__ = ["NOISE", "nvidia_driver_present", "probe_devices_quietly"]
