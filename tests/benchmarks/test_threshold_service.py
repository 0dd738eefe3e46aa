"""``benchmarks/serving/threshold_service.py`` on tiny sizes: a finished "demo run" stood in by a 300-item generated
export (brute force) and a 3,000-item generated gallery on ScaNN; every mode at concurrency 1 and 8 answered, 0 failed,
and the record's fields. Figures only in the benchmark's record."""

import json

import pytest

from benchmarks.serving import threshold_service as bench


@pytest.mark.slow
def test_threshold_service_smoke(tmp_path):
    demo = tmp_path / "demo"
    bench.generated_export(str(demo / "export"), 300, None)
    (demo / "record.json").write_text(json.dumps({"seconds": 12.5, "date": "2026-11-25T00:00:00+00:00", "seed": 0}))
    argv = ["--workdir", str(demo), "--gallery", "3000", "--brute_force_below", "1000", "--duration", "0.3"]
    assert bench.main([*argv, "--hit_queries", "10", "--out", str(tmp_path / "out")]) == 0
    record = json.loads((tmp_path / "out" / "threshold_service.json").read_text())
    assert record["failed_requests"] == 0 and record["all_requests_succeeded"]
    assert record["demo"] == {**record["demo"], "ran": False, "record_seconds": 12.5}
    assert record["machine"]["cpu_count"] and record["load_average_1min"]["samples"]
    demo_g, generated = record["galleries"]
    assert (demo_g["index_kind"], demo_g["threshold_default"]) == ("brute_force", "exact")
    assert generated["index_kind"] == "scann" and generated["manifest_set_recall"]
    for g in (demo_g, generated):
        assert g["skipped"] == [] and g["precision"] == 0.9 and g["min_probability"] == 0.9
        modes = [(row["mode"], row["concurrency"]) for row in g["rows"]]
        expected = ("top-k", "threshold", "threshold, exact", "min_probability")
        assert modes == [(m, c) for m in expected for c in (1, 8)]
        for row in g["rows"]:
            assert row["failed"] == 0 and row["answered"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0, row
        assert g["hits"]["top-k"]["mean"] == 10 and g["hits"]["threshold"]["mean"] > 0
        # each threshold response says how it was made; top-k responses carry no such flag
        assert g["hits"]["top-k"]["answered_exactly"] is None
        assert g["hits"]["threshold, exact"]["answered_exactly"] == 1.0
        assert 0.0 <= g["hits"]["threshold"]["answered_exactly"] <= 1.0
        # the exact answer holds at least as many hits as the default one, and the stand-in map's 0.9 is higher
        assert g["hits"]["threshold, exact"]["mean"] >= g["hits"]["threshold"]["mean"]
        assert g["min_probability_threshold"] >= g["threshold"]
        assert 0.0 < g["served_set_recall_vs_exact"] <= 1.0
    md = (tmp_path / "out" / "threshold_service.md").read_text()
    assert "**0 failed requests**" in md and "| threshold, exact" in md and "cores" in md


def test_query_modes_skip_a_level_the_split_could_not_estimate():
    """A manifest stores an unestimated level as None (the demo's 0.9 on 500 validation images): the benchmark asks
    for the next calibrated level, never for one the service refuses."""
    manifest = {"thresholds": {"threshold_at_precision": {"0.5": 0.83, "0.8": 0.9, "0.9": None}}}
    modes, chosen, skipped = bench.query_modes(manifest)
    assert chosen == {"precision": 0.5, "threshold": 0.83}
    assert ("threshold", {"precision": 0.5, "guarantee": False}) in modes
    assert skipped == ["min_probability: the index has no probability map"]
