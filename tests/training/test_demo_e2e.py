"""The README's main job (``ce-retrieval demo``) end to end on a tiny config: train (and the Sampled Softmax
baseline) -> evaluate side by side -> export -> index -> query through the HTTP service, in a fresh process."""

import json
import os
import subprocess
import sys

import pytest
from tiny import TINY_OVERRIDE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_demo_runs_every_stage(tmp_path):
    workdir = tmp_path / "demo"
    cmd = [
        sys.executable,
        "-m",
        "ce_retrieval.cli",
        "demo",
        "--workdir",
        str(workdir),
        "--params_override",
        TINY_OVERRIDE + ",evaluation.distractors=10,data.num_test_images=24,data.num_val_images=24,"
        "evaluation.every_n_epochs=0",
        "--baseline",
        "SampledSoftmax,SigmoidLoss",
        "--queries",
        "a red circle",
        "two blue squares",
    ]
    done = subprocess.run(
        cmd,
        env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for stage in (
        "[1/7] train",
        "[2/7] train the baseline",
        "[3/7] train the baseline",
        "[4/7] evaluate",
        "[5/7] export",
        "[6/7] index",
        "[7/7] query",
    ):
        assert stage in out
    assert "calibration, side by side" in out and "SampledSoftmax" in out and "CrossExampleSoftmax" in out
    assert "P(relevant | score) map: Brier skill" in out and "thresholds per precision" in out
    assert (workdir / "eval" / "calibration_side_by_side.png").stat().st_size > 10_000
    baseline = json.loads((workdir / "eval" / "baseline" / "eval_test.json").read_text())
    assert baseline["run_name"] == "SampledSoftmax" and baseline["config"]["loss"]["name"] == "SampledSoftmax"
    siglip = json.loads((workdir / "eval" / "baseline_SigmoidLoss" / "eval_test.json").read_text())
    assert siglip["config"]["model"]["learn_logit_bias"] and siglip["config"]["model"]["logit_bias"] == -10.0
    assert "SigmoidLoss" in out.split("calibration, side by side")[1].splitlines()[1]
    assert "GET /healthz -> 200" in out and '"a red circle"' in out and "1. image" in out
    report = json.loads((workdir / "eval" / "eval_test.json").read_text())
    assert 0.0 <= report["summary"]["pr_auc"] <= 1.0 and report["num_distractors"] == 10
    assert report["calibration_split"]["name"].endswith("val") and "transfer" in report["metrics"]
    assert (workdir / "export" / "text_encoder" / "1" / "saved_model.pb").exists()
    assert (workdir / "export" / "image_encoder" / "1" / "saved_model.pb").exists()
    assert (workdir / "export" / "index" / "1").is_dir()
    record = json.loads((workdir / "record.json").read_text())  # the main job's record (demo_record.py)
    assert record["seed"] == 0 and record["machine"]["cpu_count"] and len(record["load_average_1_5_15"]) == 3
    assert record["runs"]["CrossExampleSoftmax"]["pr_auc"] == report["summary"]["pr_auc"]
    assert (workdir / "record.md").exists() and "[demo] record:" in out
    manifest = json.loads((workdir / "export" / "index" / "1" / "manifest.json").read_text())
    assert manifest["thresholds"]["probability"]["format"] == "isotonic/1"
    promise = manifest["thresholds"]["guaranteed"]  # the evaluation's calibration, derived for this gallery
    assert promise["delta"] == 0.1 and promise["gallery_size"] == manifest["num_items"]
    assert set(promise["levels"]) == {"0.5", "0.8", "0.9"} and "threshold relevancy: every image above" in out
    assert "guaranteed_recall_0.5" in report["summary"] and report["metrics"]["promises"]["gallery_size"] > 0
    assert report["metrics"]["probability"]["ece"] is not None
