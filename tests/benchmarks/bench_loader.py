"""Loads a script of ``benchmarks/`` as a module (the scripts are not a package), for the tests of this folder."""

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as module ``bench_<name>``, registered in ``sys.modules`` (dataclasses resolve their
    annotations through it); loaded once per process."""
    key = f"bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module
