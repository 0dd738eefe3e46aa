"""Streamed global PR-AUC against scikit-learn on the flattened pairs (exact, ties included) and brute force."""

import numpy as np
import pytest
from sklearn.metrics import auc, average_precision_score, precision_recall_curve

from ce_retrieval.evaluation.calibration import global_pr_auc, threshold_for_precision


def _dyadic(rng, shape, levels=None):
    """Embeddings on a 1/64 grid (or a few levels): every dot product is exact in float32, so any computation
    order gives the same scores and ties are real ties."""
    if levels is not None:
        return rng.integers(-levels, levels + 1, shape).astype(np.float32)
    return (np.round(rng.standard_normal(shape) * 64) / 64).astype(np.float32)


def _sklearn(q, d, qi, di):
    s = (q.astype(np.float64) @ d.T.astype(np.float64)).ravel()
    y = (qi[:, None] == di[None, :]).ravel()
    precision, recall, thresholds = precision_recall_curve(y, s)
    return average_precision_score(y, s), auc(recall, precision), precision, recall, thresholds


def _case(rng, n, m, dim, num_ids, levels=None):
    q, d = _dyadic(rng, (n, dim), levels), _dyadic(rng, (m, dim), levels)
    qi, di = rng.integers(0, num_ids, n), rng.integers(0, num_ids, m)
    return q, d, qi, di


@pytest.mark.parametrize("levels", [None, 1, 2])
def test_equals_sklearn_random_and_heavy_ties(rng, levels):
    checked = 0
    for _ in range(12):
        n, m, dim = rng.integers(1, 30), rng.integers(1, 30), rng.integers(1, 5)
        q, d, qi, di = _case(rng, n, m, dim, num_ids=6, levels=levels)
        if not np.any(qi[:, None] == di[None, :]):
            continue
        out = global_pr_auc(q, d, qi, di, block_size=int(rng.integers(1, 8)), num_bins=int(rng.integers(2, 40)))
        ap, trapezoid, *_ = _sklearn(q, d, qi, di)
        assert out["average_precision"] == pytest.approx(ap, rel=1e-12, abs=1e-15)
        assert out["pr_auc"] == pytest.approx(trapezoid, rel=1e-12, abs=1e-15)
        assert out["num_pairs"] == n * m
        assert out["num_positives"] == int((qi[:, None] == di[None, :]).sum())
        checked += 1
    assert checked >= 6


def test_retrieval_split_shape_several_captions_uncaptioned_image_and_orphan_query(rng):
    # 40 images (ids 0..39); 5 captions for images 0..29, none for 30..39, and 7 captions of a missing image 99.
    d = _dyadic(rng, (40, 8))
    di = np.arange(40)
    qi = np.concatenate([np.repeat(np.arange(30), 5), np.full(7, 99)])
    q = d[np.minimum(qi, 39)] + _dyadic(rng, (len(qi), 8)) * 0.5
    out = global_pr_auc(q, d, qi, di, block_size=16)
    ap, trapezoid, *_ = _sklearn(q, d, qi, di)
    assert out["average_precision"] == pytest.approx(ap, rel=1e-12)
    assert out["pr_auc"] == pytest.approx(trapezoid, rel=1e-12)
    assert out["num_positives"] == 150
    assert out["num_queries_without_relevant"] == 7
    assert 0.3 < out["average_precision"] <= 1.0


def test_hand_made_case_with_ties():
    # scores (query 0): d0=3 (pos), d1=3 (neg), d2=1 (neg); (query 1): d0=2 (neg), d1=1 (pos), d2=0 (neg)
    q = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    d = np.array([[3.0, 2.0], [3.0, 1.0], [1.0, 0.0]], np.float32)
    qi, di = np.array([0, 1]), np.array([0, 1, 2])
    out = global_pr_auc(q, d, qi, di)
    # thresholds 3: TP 1, FP 1 -> P 1/2, R 1/2; 2: FP 2 -> P 1/3 ...; 1: TP 2, FP 3 -> P 2/5, R 1.
    assert out["average_precision"] == pytest.approx(0.5 * 0.5 + 0.5 * 0.4)
    # trapezoid: (0,1)->(.5,.5) area .375; (.5,1/3)->(1,.4) area .5*(1/3+.4)/2
    assert out["pr_auc"] == pytest.approx(0.375 + 0.5 * (1 / 3 + 0.4) / 2)
    # F1: 0.5 at threshold 3, 4/7 at threshold 1 (the best).
    assert out["best_f1"]["threshold"] == 1.0
    assert out["best_f1"]["f1"] == pytest.approx(4 / 7)
    assert out["best_f1"]["queries_top1_above"] == 1.0
    assert out["best_f1"]["queries_top1_relevant_above"] == 0.5  # query 0's top result d0 (lower index of the tie)
    assert out["precision_thresholds"]["0.5"] == {"threshold": 3.0, "precision": 0.5, "recall": 0.5}
    assert out["threshold_at_precision"]["0.5"] == 3.0


def test_best_f1_and_precision_thresholds_match_brute_force(rng):
    q, d, qi, di = _case(rng, 25, 20, 3, num_ids=8, levels=2)
    out = global_pr_auc(q, d, qi, di, block_size=3, target_precisions=(0.2, 0.5, 0.99))
    _, _, precision, recall, thresholds = _sklearn(q, d, qi, di)
    p, r = precision[:-1], recall[:-1]
    f1 = np.where(p + r > 0, 2 * p * r / np.maximum(p + r, 1e-300), 0)
    assert out["best_f1"]["f1"] == pytest.approx(f1.max(), rel=1e-12)
    best_t = thresholds[f1 == f1.max()].max()
    assert out["best_f1"]["threshold"] == pytest.approx(best_t)
    s = q @ d.T
    assert out["best_f1"]["queries_top1_above"] == pytest.approx(np.mean(s.max(axis=1) >= best_t))
    pos_scores = set(s[qi[:, None] == di[None, :]].tolist())
    for target in (0.2, 0.5, 0.99):
        ok = [t for t, pr in zip(thresholds, p, strict=True) if pr >= target and t in pos_scores]
        got = out["precision_thresholds"][f"{target:g}"]
        if not ok:
            assert got is None
        else:
            assert got["threshold"] == pytest.approx(min(ok)) and got["precision"] >= target


def test_result_independent_of_blocks_and_grid(rng):
    q, d, qi, di = _case(rng, 37, 23, 4, num_ids=10, levels=1)
    ref = global_pr_auc(q, d, qi, di)
    for block, bins in [(1, 2), (5, 3), (37, 1 << 12), (100, 7)]:
        out = global_pr_auc(q, d, qi, di, block_size=block, num_bins=bins)
        assert out["average_precision"] == ref["average_precision"]
        assert out["pr_auc"] == ref["pr_auc"]
        assert out["best_f1"] == ref["best_f1"]


def test_curve_for_plotting(rng):
    q, d, qi, di = _case(rng, 60, 50, 4, num_ids=30)
    out = global_pr_auc(q, d, qi, di, curve_points=16)
    curve = out["curve"]
    assert curve["recall"][0] == 0.0 and curve["precision"][0] == 1.0
    assert curve["recall"][-1] == pytest.approx(1.0)
    assert np.all(np.diff(curve["recall"]) >= 0) and len(curve["recall"]) <= 19
    assert len(curve["precision"]) == len(curve["threshold"]) == len(curve["recall"])


def test_threshold_for_precision_none_when_unreachable():
    assert threshold_for_precision(np.array([2.0, 1.0]), np.array([0.4, 0.3]), np.array([0.5, 1.0]), 0.5) is None
    got = threshold_for_precision(np.array([2.0, 1.0]), np.array([0.6, 0.5]), np.array([0.5, 1.0]), 0.5)
    assert got == {"threshold": 1.0, "precision": 0.5, "recall": 1.0}


def test_bad_inputs_raise_clear_errors(rng):
    q, d = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    with pytest.raises(ValueError, match="no positive pairs"):
        global_pr_auc(q, d, [0, 1, 2], [5, 6, 7, 8, 9])
    with pytest.raises(ValueError, match="dimension"):
        global_pr_auc(q, d[:, :3], [0, 1, 2], [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="query_ids has 2 entries"):
        global_pr_auc(q, d, [0, 1], [0, 1, 2, 3, 4])
    bad = q.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        global_pr_auc(bad, d, [0, 1, 2], [0, 1, 2, 3, 4])


def test_accepts_float16_and_tensors(rng):
    import tensorflow as tf

    q, d, qi, di = _case(rng, 10, 12, 3, num_ids=5, levels=2)
    ref = global_pr_auc(q, d, qi, di)
    out = global_pr_auc(tf.constant(q, tf.float16), tf.constant(d), tf.constant(qi), di)
    assert out["average_precision"] == ref["average_precision"]


def test_equals_sklearn_on_continuous_float32_scores(rng):
    # Non-dyadic scores: sklearn gets the very float32 values of the same row-block products.
    q = rng.standard_normal((300, 16)).astype(np.float32)
    d = rng.standard_normal((200, 16)).astype(np.float32)
    qi, di = rng.integers(0, 150, 300), np.arange(200)
    q[qi < 200] += d[qi[qi < 200]]
    rows = 64
    dt = np.ascontiguousarray(d.T)
    s = np.concatenate([q[r : r + rows] @ dt for r in range(0, len(q), rows)]).ravel()
    y = (qi[:, None] == di[None, :]).ravel()
    precision, recall, _ = precision_recall_curve(y, s)
    out = global_pr_auc(q, d, qi, di, block_size=rows)
    assert out["average_precision"] == pytest.approx(average_precision_score(y, s), rel=1e-12)
    assert out["pr_auc"] == pytest.approx(auc(recall, precision), rel=1e-12)


def test_falls_back_to_full_blocks_when_pass_one_bits_differ(rng, monkeypatch):
    from ce_retrieval.evaluation import calibration

    q, d, qi, di = _case(rng, 40, 30, 3, num_ids=10, levels=2)
    ref = global_pr_auc(q, d, qi, di, block_size=8)
    original = calibration._block_positives
    calls = []

    def perturbed(q_, dt_, r0, r1, rows_b, cols_b, narrow):
        calls.append(narrow)
        out = original(q_, dt_, r0, r1, rows_b, cols_b, narrow)
        return np.nextafter(out, np.float32(np.inf)) if narrow else out  # one ulp off, like another BLAS kernel

    monkeypatch.setattr(calibration, "_block_positives", perturbed)
    out = global_pr_auc(q, d, qi, di, block_size=8, num_threads=2)
    assert True in calls and False in calls
    assert out["average_precision"] == ref["average_precision"] and out["pr_auc"] == ref["pr_auc"]
