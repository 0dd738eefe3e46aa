"""Issue #30: the calibration suite's figures are reproducible. Two fresh processes run the same small plan (the
quick plan's tiny digits family and model, one seed, CE in both regimes) and write the same numbers, bit for bit: the
family's frozen features (``benchmarks/quality/family_features.py``), every run's test embeddings and every figure of
every run and table. Before the one seeding point the towers were built before any seed was set, so every process
pretrained different features."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import ROOT

PLAN = ["--quick", "--seeds", "1", "--objectives", "CE", "--scratch_objectives", "CE"]
TIMINGS = ("seconds", "train_seconds", "minutes", "machine")


def _start(out):
    command = [sys.executable, "-m", "benchmarks.quality.calibration_suite", *PLAN]
    command += ["--out", str(out), "--results", str(out / "results")]
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _figures(doc):
    """``doc`` less what a clock or the machine's load decides."""
    if isinstance(doc, dict):
        return {k: _figures(v) for k, v in doc.items() if k not in TIMINGS}
    if isinstance(doc, list):
        return [_figures(v) for v in doc]
    return doc


def _written(out) -> dict:
    """Every array and figure a run of the plan wrote under ``out``, by relative path."""
    found = {}
    for path in sorted([*out.glob("features/**/*.npz"), *out.glob("runs/**/*.npz")]):
        with np.load(path) as z:
            found[str(path.relative_to(out))] = {k: z[k] for k in z.files}
    for path in sorted([*out.glob("runs/**/*.json"), out / "results" / "suite.json"]):
        found[str(path.relative_to(out))] = _figures(json.loads(path.read_text()))
    return found


@pytest.mark.slow
def test_two_fresh_processes_write_the_same_features_and_figures(tmp_path):
    outs = [tmp_path / "first", tmp_path / "second"]
    processes = [_start(out) for out in outs]  # side by side: about half the wall time on 2 cores
    for process in processes:
        log, _ = process.communicate(timeout=600)
        assert process.returncode == 0, log[-4000:]
    first, second = (_written(out) for out in outs)
    assert sorted(first) == sorted(second)
    features = first["features/digits/features.npz"]
    assert {"train_text", "train_image", "test_image", "distractor_image"} <= set(features)
    assert len([p for p in first if p.startswith("runs/")]) == 4  # heads CE and scratch CE: .json + .npz
    for path, arrays in first.items():
        if path.endswith(".npz"):
            for key, value in arrays.items():
                assert np.array_equal(value, second[path][key]), f"{path}: {key} differs between the processes"
        else:
            assert arrays == second[path], f"{path}: a figure differs between the processes"
