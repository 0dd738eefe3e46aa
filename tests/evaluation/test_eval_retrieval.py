"""Recall@K, exact chunked search and the ANN-loss helper against brute-force NumPy (stable sorts, ties included)."""

import numpy as np
import pytest

from ce_retrieval.evaluation.retrieval import ann_recall_loss, recall_at_k, recall_with_distractors
from ce_retrieval.search.exact import ExactSearch, exact_search


def _quantised(rng, shape, levels=2):
    return rng.integers(-levels, levels + 1, shape).astype(np.float32)


def _brute_ranking(q, d):
    s = q.astype(np.float64) @ d.T.astype(np.float64)
    return np.argsort(-s, axis=1, kind="stable"), s


def _brute_recall(q, d, qi, di, ks):
    order, _ = _brute_ranking(q, d)
    keep = np.isin(qi, di)
    out = {}
    for k in ks:
        hit = (di[order[:, :k]] == qi[:, None]).any(axis=1)
        out[k] = float(hit[keep].mean())
    return out, int((~keep).sum())


@pytest.mark.parametrize("block_elements", [1, 7, 64, 1 << 22])
def test_exact_search_is_stable_top_k(rng, block_elements):
    q, d = _quantised(rng, (13, 3), 1), _quantised(rng, (29, 3), 1)  # heavy ties
    order, s = _brute_ranking(q, d)
    for k in (1, 4, 29, 50):
        idx, scores = exact_search(q, d, k, block_elements=block_elements)
        kk = min(k, 29)
        np.testing.assert_array_equal(idx, order[:, :kk])
        np.testing.assert_array_equal(scores, np.take_along_axis(s, order[:, :kk], axis=1).astype(np.float32))


def test_recall_matches_brute_force_with_captions_orphans_and_uncaptioned_images(rng):
    num_images, dim = 30, 4
    d = _quantised(rng, (num_images, dim))
    di = np.arange(100, 100 + num_images)
    # 3 captions for images 0..24, none for 25..29; 4 captions of an image that is not in the gallery.
    qi = np.concatenate([np.repeat(di[:25], 3), np.full(4, 7)])
    q = d[np.clip(qi - 100, 0, num_images - 1)] + _quantised(rng, (len(qi), dim), 1)
    ks = (1, 5, 10)
    out = recall_at_k(q, d, qi, di, ks=ks, block_elements=50)
    t2i, t2i_out = _brute_recall(q, d, qi, di, ks)
    i2t, i2t_out = _brute_recall(d, q, di, qi, ks)
    assert out["t2i"] == pytest.approx(t2i) and out["i2t"] == pytest.approx(i2t)
    assert out["rsum"] == pytest.approx(sum(t2i.values()) + sum(i2t.values()))
    assert (out["t2i_excluded"], out["t2i_queries"]) == (4, 75) == (t2i_out, 75)
    assert (out["i2t_excluded"], out["i2t_queries"]) == (5, 25) == (i2t_out, 25)
    assert 0 < out["t2i"][1] <= out["t2i"][5] <= out["t2i"][10] <= 1


def test_hand_made_recall():
    d = np.array([[1, 0], [0, 1], [-1, 0]], np.float32)
    q = np.array([[1, 0.1], [0.9, 0.2], [-1, 0]], np.float32)  # caption 1 describes image 1 but is closest to 0
    out = recall_at_k(q, d, [0, 1, 2], [0, 1, 2], ks=(1, 2))
    assert out["t2i"] == {1: pytest.approx(2 / 3), 2: 1.0}
    # images: 0 -> captions (0, 1) best 0 (hit); 1 -> caption 1 scores 0.2 vs 0.1, 0 (hit); 2 -> caption 2 (hit)
    assert out["i2t"] == {1: 1.0, 2: 1.0}


def test_distractors_match_brute_force_and_lose_ties_to_test_images(rng):
    d = _quantised(rng, (20, 3))
    di = np.arange(20)
    q = d + _quantised(rng, (20, 3), 1)
    distractors = np.concatenate([d[:5], _quantised(rng, (40, 3))])  # exact copies tie with relevant images
    out = recall_with_distractors(q, d, di, di, distractors, ks=(1, 5, 10, 100), block_elements=33)
    gallery = np.concatenate([d, distractors])
    order, _ = _brute_ranking(q, gallery)
    for k in (1, 5, 10, 100):
        hit = (order[:, :k] < 20) & (di[np.minimum(order[:, :k], 19)] == di[:, None])
        assert out["t2i"][k] == pytest.approx(hit.any(axis=1).mean())
    assert out["num_distractors"] == 45 and out["gallery_size"] == 65
    base = recall_at_k(q, d, di, di, ks=(1, 5, 10))
    assert out["t2i"][1] <= base["t2i"][1]


def test_pluggable_search_and_ann_loss(rng):
    d = rng.standard_normal((50, 8)).astype(np.float32)
    q = d + 0.5 * rng.standard_normal((50, 8)).astype(np.float32)
    ids = np.arange(50)
    exact = ExactSearch(d)
    assert recall_at_k(q, d, ids, ids, search_fn=exact) == recall_at_k(q, d, ids, ids)
    same = ann_recall_loss(q, d, ids, ids, exact, ks=(1, 10))
    assert same["loss"] == {1: 0.0, 10: 0.0} and same["neighbour_recall"] == {1: 1.0, 10: 1.0}

    def half_gallery(query, k):  # an "approximate" searcher that only sees the first 25 images
        idx, scores = exact_search(query, d[:25], k)
        return idx, scores

    lossy = ann_recall_loss(q, d, ids, ids, half_gallery, ks=(1, 10))
    exact_r1 = recall_at_k(q, d, ids, ids, ks=(1,))["t2i"][1]
    order, _ = _brute_ranking(q, d[:25])
    ann_r1 = float((order[:, 0] == ids).mean())
    assert lossy["exact"][1] == pytest.approx(exact_r1)
    assert lossy["ann"][1] == pytest.approx(ann_r1)
    assert lossy["loss"][1] == pytest.approx(exact_r1 - ann_r1) and lossy["loss"][1] > 0
    assert 0 < lossy["neighbour_recall"][10] < 1


def test_missing_results_marked_minus_one_are_misses(rng):
    d = np.eye(5, dtype=np.float32)
    ids = np.arange(5)
    out = recall_at_k(
        d, d, ids, ids, ks=(1, 5), search_fn=lambda q, k: (np.full((len(q), k), -1), np.zeros((len(q), k)))
    )
    assert out["t2i"] == {1: 0.0, 5: 0.0} and out["i2t"][1] == 1.0


def test_bad_ks_and_shapes(rng):
    d = rng.standard_normal((5, 2))
    with pytest.raises(ValueError, match="ks"):
        recall_at_k(d, d, np.arange(5), np.arange(5), ks=())
    with pytest.raises(ValueError, match="dimension"):
        recall_with_distractors(d, d, np.arange(5), np.arange(5), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="k must be"):
        exact_search(d, d, 0)


def test_scann_searcher_plugs_in(rng):
    from ce_retrieval.search.ann import ScannSearch

    d = rng.standard_normal((600, 16)).astype(np.float32)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    q = d + 0.3 * rng.standard_normal((600, 16)).astype(np.float32)
    ids = np.arange(600)
    brute = ScannSearch(d, brute_force=True)
    idx, scores = brute(q, 10)
    ref_idx, ref_scores = exact_search(q, d, 10)
    # Brute force finds exactly the exact top-10. Its float32 dot products are summed in another order, so two
    # scores closer than float32 resolution may come out swapped (2 of 6,000 here, 8e-8 apart): order each row's
    # hits by the float64 score with ties to the lower id, which makes the comparison exact and deterministic.
    order, s64 = _brute_ranking(q, d)
    by_score = np.argsort(-np.take_along_axis(s64, idx, axis=1), axis=1, kind="stable")
    np.testing.assert_array_equal(np.take_along_axis(idx, by_score, axis=1), order[:, :10])
    np.testing.assert_array_equal(ref_idx, order[:, :10])
    np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=3e-7)
    tree = ScannSearch(d, num_leaves=24, num_leaves_to_search=12)
    report = ann_recall_loss(q, d, ids, ids, tree, ks=(1, 10))
    assert report["neighbour_recall"][10] > 0.7
    assert abs(report["loss"][1]) < 0.1
    assert recall_at_k(q, d, ids, ids, search_fn=brute)["t2i"] == recall_at_k(q, d, ids, ids)["t2i"]


def test_one_scann_setup_for_evaluation_and_serving(rng):
    # ScannSearch and the serving index had their own ScaNN builders; they disagreed on the tree (plain vs
    # spherical k-means) and the re-ranking depth (max(k, 100) vs 100, or 200 from 500,000 items). The rule now
    # shared (search.ann.build_scann / default_params): spherical leaves, and re-rank at least the k results
    # asked for, 100 candidates, or 200 on galleries of 500,000 items or more.
    from ce_retrieval.search.ann import IndexParams, ScannSearch, default_params, scann_builder

    p = default_params(4000)
    assert (p.num_leaves, p.training_sample_size, p.reorder_num_neighbors, p.spherical_tree) == (63, 4000, 100, True)
    assert default_params(600_000).reorder_num_neighbors == 200
    assert default_params(4000, num_neighbors=300).reorder_num_neighbors == 300
    assert default_params(4000, IndexParams(num_leaves=7, reorder_num_neighbors=50)).num_leaves == 7
    d = rng.standard_normal((600, 16)).astype(np.float32)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    search = ScannSearch(d, max_k=150)
    assert search.params == default_params(600, IndexParams(training_sample_size=600), num_neighbors=150)
    config = scann_builder(d, search.params, 150).create_config()
    assert "partitioning_type: SPHERICAL" in config and "approx_num_neighbors: 150" in config
