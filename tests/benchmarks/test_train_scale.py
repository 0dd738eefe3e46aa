"""``benchmarks/scale/train_scale.py`` at smoke size (its figures live in BENCHMARKS.md): the model built from the
config takes the loss path each configuration selects (tiled; sharded + tiled over 2 logical replicas), its train step
gives a finite loss, and the record has every field."""

import json

import pytest

from benchmarks.scale import train_scale as bench

TINY = (  # the demo towers, smaller: the same layers, fewer and narrower (two image stages: a run is mostly tracing)
    "model.embedding_dim=16,model.text.hidden_size=16,model.text.num_layers=1,model.text.intermediate_size=32,"
    "model.image.image_size=32,model.image.stackwise_filters=[4,8],model.image.stackwise_blocks=[1,1],"
    "model.image.stackwise_strides=[1,2]"
)


@pytest.mark.slow
def test_smoke_run_takes_the_configured_paths_and_writes_the_record(tmp_path):
    argv = ["--runs", "a,c", "--tile", "64", "--baseline_batch", "256", "--chunk", "128", "--replica_batch", "128",
            "--replicas", "2", "--replica_chunk", "32", "--override", TINY, "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    record = json.loads((tmp_path / "train_scale.json").read_text())
    runs = {r["key"]: r for r in record["runs"]}
    assert runs["a"]["path"] == "replicated, tiled (T = 64)" and runs["a"]["path_name"] == "tiled"
    assert runs["a"]["chunks_per_replica"] == 2 and len(runs["a"]["step_times_s"]) == 1
    assert runs["c"]["path"] == "sharded, tiled (T = 64)" and runs["c"]["path_name"] == "sharded + tiled"
    assert runs["c"]["num_replicas"] == 2 and runs["c"]["chunks_per_replica"] == 2
    assert "MirroredStrategy" in runs["c"]["describe"]
    for r in runs.values():
        assert r["loss_finite"] and r["peak_rss_mb"] >= r["rss_after_build_mb"] > 0, r
        assert r["trace_s"] > 0 and r["traces"] == 1 and r["first_step_s"] > 0 and r["ms_per_example"] > 0
    assert set(record["against_baseline"]) == {"c"} and record["against_baseline"]["c"]["peak_rss_ratio"] > 0
    assert record["machine"]["cores"] and record["machine"]["date"] and record["machine"]["load_samples"]
    text = (tmp_path / "train_scale.md").read_text()
    assert "python -m benchmarks.scale.train_scale --runs a,c" in text and record["machine"]["cpu"] in text
    assert "| c: 2 replicas: sharded + tiled + gradient cache | 128 | 2 | sharded, tiled (T = 64) |" in text


def test_first_step_only_is_reported_as_such():
    """A run without timed steps (run b at 65,536 by default) takes its time per example from the first step."""
    base = {
        "key": "a",
        "label": "a",
        "batch": 4,
        "chunk": 2,
        "replicas": 1,
        "expect": "tiled",
        "peak_rss_mb": 20.0,
        "rss_after_build_mb": 10.0,
        "first_step_s": 2.0,
        "ms_per_example": 1.0,
        "ms_per_example_from": "timed",
    }
    large = base | {
        "key": "b",
        "batch": 8,
        "peak_rss_mb": 30.0,
        "first_step_s": 8.0,
        "ms_per_example": 1000.0,
        "ms_per_example_from": "first step (graph optimisation + one step)",
    }
    ratios = bench.compare([base, large])["b"]
    assert ratios["peak_rss_ratio"] == 1.5 and ratios["peak_rss_above_build_ratio"] == 2.0
    assert ratios["first_step_ms_per_example_ratio"] == 2.0 and "first step" in ratios["ms_per_example_basis"]


def test_a_run_refuses_an_unknown_configuration():
    with pytest.raises(SystemExit, match="unknown configuration"):
        bench.plan(bench.parse_args(["--runs", "a,x"]))
