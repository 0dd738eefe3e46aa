"""What a benchmark record says about the machine: the CPU model, the cores, and the load average sampled during the
run (so a reader sees what else ran beside it) and the date (:func:`machine_info`), or the main job's fuller
description (:func:`host`: instruction sets, versions); and :func:`run_module`, a measurement in a fresh process (its
peak memory its own). No TensorFlow import: a parent that only starts children stays small."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time


class LoadSampler(threading.Thread):
    """Samples the 1-minute load average every ``every`` seconds (and once at start) until ``stop`` is set."""

    def __init__(self, loads: list, every: float = 60.0):
        super().__init__(daemon=True)
        self.loads, self.every, self.stop = loads, every, threading.Event()
        self.loads.append(os.getloadavg()[0])

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.loads.append(os.getloadavg()[0])


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages now, rounded to 2 decimals (a record's ``load_average_1_5_15``)."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_name() -> str:
    """The CPU model from ``/proc/cpuinfo`` (``platform.processor()`` where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def machine_info(loads: list) -> dict:
    """CPU, cores, the load samples (one more taken now) and the date (UTC) for a record."""
    loads = [*loads, os.getloadavg()[0]]
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "load_min": min(loads),
        "load_max": max(loads),
        "load_samples": [round(x, 2) for x in loads],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def host() -> dict:
    """CPU model, cores, instruction sets and library versions, as the main job's record states them
    (``ce_retrieval.cli.demo_record.machine``); imported when called, so this module stays free of TensorFlow."""
    from ce_retrieval.cli.demo_record import machine

    return machine()


def run_module(module: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """Runs benchmark module ``module`` (a script passes its ``__spec__.name``) with ``args`` in a fresh Python
    process, output captured as text; ``kwargs`` go to :func:`subprocess.run` (e.g. ``timeout``). The child is
    started as ``python -m`` from the current folder, the repository root, as every benchmark is."""
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, **kwargs)


__all__ = ["LoadSampler", "cpu_name", "host", "load_average", "machine_info", "run_module"]
