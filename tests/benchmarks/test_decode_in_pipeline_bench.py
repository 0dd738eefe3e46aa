"""``benchmarks/scale/decode_in_pipeline.py`` on the tests' tiny model (its figure lives in BENCHMARKS.md): both kinds
run, train the same weights, and the record says so."""

import json
import os
import sys

from benchmarks.scale import decode_in_pipeline as bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "training"))
from tiny import TINY_OVERRIDE  # noqa: E402


def test_smoke_both_kinds_train_the_same_weights(tmp_path):
    argv = ["--params_override", TINY_OVERRIDE, "--repeats", "1", "--warmup", "1", "--steps", "2"]
    argv += ["--out", str(tmp_path)]
    assert bench.main(argv) == 0
    record = json.loads((tmp_path / "decode_in_pipeline.json").read_text())
    assert [r["kind"] for r in record["runs"]] == list(bench.KINDS)
    assert record["summary"]["same_weights"] and all(r["ms_per_step"] > 0 for r in record["runs"])
    text = (tmp_path / "decode_in_pipeline.md").read_text()
    assert "The same weights from every run: True" in text and "python -m benchmarks.scale.decode_in_pipeline" in text


def test_summary_flags_different_weights():
    runs = [
        {"kind": bench.KINDS[0], "ms_per_step": 100.0, "weights_sha256": "a"},
        {"kind": bench.KINDS[1], "ms_per_step": 150.0, "weights_sha256": "b"},
    ]
    summary = bench.summarise(runs)
    assert summary["speedup"] == 1.5 and not summary["same_weights"]
