"""``benchmarks/serving/threshold_leaves.py`` on a 20,000-item gallery: the record's fields and the counts' invariants
(figures only in the benchmark's record)."""

import json

import numpy as np
import pytest

from benchmarks.serving import threshold_leaves as bench


def test_leaf_stats_counts_the_oracle_leaves_and_the_expansion():
    leaf = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])  # leaf of each of 10 rows
    truth = [np.array([0, 1, 3, 5]), np.array([6, 7, 8])]
    found = [np.array([0]), np.array([], np.int64)]
    st = bench.leaf_stats(leaf, truth, found)
    # query 0: leaves 0 (2 hits), 1, 2 -> 99 % needs all 3; query 1: one leaf
    assert st["oracle_leaves_99_median"] == 2.0 and st["leaves"] == 4
    assert st["expanded_set_recall"] == pytest.approx(2 / 7)  # leaf 0 brings rows 0, 1; query 1 found nothing
    assert st["items_scored_per_query"] == 1.5  # leaf 0 has 3 rows; query 1 scores none


@pytest.mark.slow
def test_threshold_leaves_bench_writes_its_record(tmp_path):
    bench.main(["--n", "20000", "--queries", "20", "--workdir", str(tmp_path), "--out", str(tmp_path / "out")])
    r = json.loads((tmp_path / "out" / "threshold_leaves.json").read_text())
    assert set(r["query_sets"]) == {"gallery_clusters", "gallery_clusters_noisy", "other_clusters"}
    assert r["machine"]["cpu_count"]
    same = r["query_sets"]["gallery_clusters"]
    assert 0 <= same["own_cluster_share"] <= 1  # at 20k (10 items a cluster) most of 100 hits are elsewhere
    for st in same["partitions"].values():
        # expansion only adds hits: never below what the ANN found without it
        assert same["ann_set_recall_no_expansion"] <= st["expanded_set_recall"] + 1e-9
        assert 0 < st["items_scored_per_query"] <= 20000
    assert "load average" in (tmp_path / "out" / "threshold_leaves.md").read_text()
