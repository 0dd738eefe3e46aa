"""``benchmarks/serving/threshold_search.py`` on a 20,000-item gallery (the smallest that gets a ScaNN index): the
record's fields, exact mode equal to the scan, the index kept with ``--keep`` and reused by a second run. Figures
only in the benchmark's record."""

import json

import numpy as np
import pytest

from benchmarks.serving import threshold_search as bench


def test_query_streams_share_the_gallery_clusters_and_draw_other_samples():
    """Held-out queries of another stream are new samples of the gallery's clusters (near its centres), not rows of
    the gallery; another seed gives other clusters."""
    x = bench.hard_gallery(20000)  # 10 items per cluster
    same = bench.hard_gallery(200, stream=bench.QUERY_STREAM)
    other = bench.hard_gallery(200, seed=bench.SEED + 1)
    assert not np.isin(same.view("V512"), x.view("V512")).any()  # no gallery row is reused as a query
    assert np.median(np.max(same @ x.T, axis=1)) > np.median(np.max(other @ x.T, axis=1)) + 0.1


def test_exact_topk_is_the_best_k():
    rng = np.random.default_rng(1)
    q, x = rng.normal(size=(5, 8)).astype(np.float32), rng.normal(size=(300, 8)).astype(np.float32)
    want = np.sort(np.argsort(-(q @ x.T), axis=1)[:, :7], axis=1)
    np.testing.assert_array_equal(np.sort(bench.exact_topk(q, x, 7, block=50), axis=1), want)
    assert bench.recall_at(want, want) == 1.0 and bench.recall_at(want[::-1], want) < 1.0


def test_kth_scores_is_the_kth_best_score():
    rng = np.random.default_rng(0)
    q, x = rng.normal(size=(7, 16)).astype(np.float32), rng.normal(size=(1000, 16)).astype(np.float32)
    want = np.sort(q @ x.T, axis=1)[:, -5]
    np.testing.assert_allclose(bench.kth_scores(q, x, 5, block=64), want, rtol=1e-5, atol=1e-5)
    want = np.sort(q @ x[:3].T, axis=1)[:, 0]  # k > n: the n-th
    np.testing.assert_allclose(bench.kth_scores(q, x[:3], 5), want, rtol=1e-5, atol=1e-5)


def test_noisy_queries_are_further_from_their_clusters():
    x = bench.hard_gallery(20000)
    same = bench.hard_gallery(200, stream=bench.QUERY_STREAM)
    noisy = bench.hard_gallery(200, stream=bench.QUERY_STREAM, noise=bench.QUERY_NOISE)
    assert np.median(np.max(same @ x.T, axis=1)) > np.median(np.max(noisy @ x.T, axis=1))
    np.testing.assert_array_equal(bench.hard_gallery(200, stream=bench.QUERY_STREAM, noise=0.0), same)


@pytest.mark.slow
def test_threshold_search_bench_keeps_and_reuses_its_index(tmp_path):
    """Both builds (with validation queries, and build_index's defaults), three query sets each, the answers'
    flags, kept and reused."""
    argv = ["--n", "20000", "--queries", "20", "--repeats", "1", "--workdir", str(tmp_path), "--keep"]
    argv += ["--out", str(tmp_path / "out")]
    bench.main(argv)
    first = json.loads((tmp_path / "out" / "threshold_search_issue32_20000.json").read_text())
    assert first["complete"] and set(first["builds"]) == {"validation", "defaults"}
    for b in first["builds"].values():
        assert not b["index_reused"]
        assert set(b["query_sets"]) == {"gallery_clusters", "gallery_clusters_noisy", "other_clusters"}
        for qs in b["query_sets"].values():
            assert set(qs["queries_per_second"]) == {
                "top10",
                "top100_threshold_setting",
                "threshold_approximate",
                "threshold_exact",
                "numpy_scan",
            }
            assert qs["exact_equals_scan"] and qs["hits"]["median"] >= 20 and 0 < qs["recall_at_10"] <= 1
            assert 0 <= qs["answers"]["exact_share"] <= 1 and sum(qs["answers"]["reasons"].values()) == 20
        # the calibrated stand-in tau and the build's validation queries come from the gallery's clusters
        assert b["query_sets"]["gallery_clusters"]["tau"] == first["tau"]
        assert b["query_sets"]["gallery_clusters"]["set_recall_held_out"] >= 0.9
        assert set(b["build_phases_seconds"]) == {"threshold_partitions", "scann_and_top10_tuning", "threshold_tuning"}
    assert first["builds"]["validation"]["manifest_ann"]["query_source"] == "given queries"
    assert first["builds"]["validation"]["manifest_threshold_search"]["measured_on"] == "given_queries"
    assert first["builds"]["defaults"]["manifest_threshold_search"]["measured_on"] == "gallery_items"
    assert first["machine"]["cpu_count"] and first["command"].endswith("--out " + str(tmp_path / "out"))
    work = tmp_path / "threshold_search_20000"
    assert not (work / "gallery.npy").exists() and (work / "index" / "manifest.json").exists()
    assert (work / "index_defaults" / "manifest.json").exists()
    assert "cores" in (tmp_path / "out" / "threshold_search_issue32_20000.md").read_text()
    bench.main(argv)  # the kept indexes are reused: same tau and builds, nothing generated again
    second = json.loads((tmp_path / "out" / "threshold_search_issue32_20000.json").read_text())
    assert second["complete"] and all(b["index_reused"] for b in second["builds"].values())
    assert second["tau"] == first["tau"]
    assert [b["build_seconds"] for b in second["builds"].values()] == [
        b["build_seconds"] for b in first["builds"].values()
    ]
