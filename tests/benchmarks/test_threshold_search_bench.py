"""``benchmarks/threshold_search.py`` on a 20,000-item gallery (the smallest that gets a ScaNN index): the record's
fields, exact mode equal to the scan, the index kept with ``--keep`` and reused by a second run. Figures only in
the benchmark's record."""

import json

import numpy as np
import pytest
from bench_loader import load_benchmark


def test_kth_scores_is_the_kth_best_score():
    bench = load_benchmark("threshold_search")
    rng = np.random.default_rng(0)
    q, x = rng.normal(size=(7, 16)).astype(np.float32), rng.normal(size=(1000, 16)).astype(np.float32)
    want = np.sort(q @ x.T, axis=1)[:, -5]
    np.testing.assert_allclose(bench.kth_scores(q, x, 5, block=64), want, rtol=1e-5, atol=1e-5)
    want = np.sort(q @ x[:3].T, axis=1)[:, 0]  # k > n: the n-th
    np.testing.assert_allclose(bench.kth_scores(q, x[:3], 5), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_threshold_search_bench_keeps_and_reuses_its_index(tmp_path):
    bench = load_benchmark("threshold_search")
    argv = ["--n", "20000", "--queries", "20", "--repeats", "1", "--workdir", str(tmp_path), "--keep"]
    argv += ["--out", str(tmp_path / "out")]
    bench.main(argv)
    first = json.loads((tmp_path / "out" / "threshold_search_20000.json").read_text())
    assert first["complete"] and not first["index_reused"] and first["exact_equals_scan"]
    assert set(first["queries_per_second"]) == {"top10", "threshold_approximate", "threshold_exact", "numpy_scan"}
    assert first["set_recall_held_out"] >= 0.9 and first["hits"]["median"] >= 50
    assert first["machine"]["cpu_count"] and first["command"].endswith("--out " + str(tmp_path / "out"))
    work = tmp_path / "threshold_search_20000"
    assert not (work / "gallery.npy").exists() and (work / "index" / "manifest.json").exists()
    assert "cores" in (tmp_path / "out" / "threshold_search_20000.md").read_text()
    bench.main(argv)  # the kept index is reused: same tau and build, nothing generated again
    second = json.loads((tmp_path / "out" / "threshold_search_20000.json").read_text())
    assert second["complete"] and second["index_reused"] and second["exact_equals_scan"]
    assert (second["tau"], second["build_seconds"]) == (first["tau"], first["build_seconds"])
