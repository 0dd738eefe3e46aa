"""The recalibration benchmark (#29 part 4) at its smallest size: tiny families and model, one size of labels, three
draws; the record and its table have every part, and the promise bookkeeping counts what it should."""

import json

import numpy as np
import pytest

from benchmarks.quality import recalibration as bench


@pytest.mark.slow
def test_quick_plan_writes_the_record(tmp_path):
    results = tmp_path / "results"
    assert bench.main(["--quick", "--out", str(tmp_path), "--results", str(results)]) == 0
    record = json.loads((results / "recalibration_shapes_to_vague.json").read_text())
    assert record["gallery_size"] == 30 and record["served_queries"] == 60
    assert set(record["before"]) >= {"guaranteed", "estimated"} and set(record["in_domain"]) == {"0.3", "0.5"}
    size = record["sizes"]["20"]
    assert size["draws"] == 3 and 0.0 <= size["guaranteed"]["all_kept"] <= 1.0
    assert set(size["guaranteed"]["levels"]) == {"0.3", "0.5"}
    md = (results / "recalibration_shapes_to_vague.md").read_text()
    assert "served on **vague**" in md and "| 20 | guaranteed |" in md and "| 20 | estimated |" in md


def test_a_promise_is_checked_on_the_held_out_queries():
    truth = bench.Truth.__new__(bench.Truth)
    truth.scores = np.array([[0.9, 0.1], [0.8, 0.7], [0.2, 0.6]])
    truth.relevant = np.array([[True, False], [False, True], [False, True]])
    rows = np.array([0, 1])
    out = bench.kept({"0.5": 0.75, "0.8": 0.65, "0.9": None}, truth, rows)
    assert out["0.5"]["precision"] == 0.5 and out["0.5"]["kept"]  # rows 0, 1 at 0.75: (0, 0) right, (1, 0) wrong
    assert out["0.8"]["precision"] == pytest.approx(2 / 3) and not out["0.8"]["kept"]
    assert out["0.9"] == {"threshold": None, "kept": True}  # refused: nothing promised
    summary = bench.summarise([{"guaranteed": out, "estimated": out}] * 2, None)
    assert summary["guaranteed"]["all_kept"] == 0.0 and summary["guaranteed"]["levels"]["0.9"]["certified"] == 0.0
