"""The score -> P(relevant) map: equal to a brute-force isotonic fit on hand-made cases, monotone and within [0, 1],
binned fit equal to the unbinned one, and its reliability figures against a float64 reference."""

import numpy as np
import pytest

from ce_retrieval.evaluation.probability import ProbabilityMap, fit_probability_map, fit_scores, reliability


def brute_isotonic(x, y, w):
    """Weighted isotonic regression by its min-max formula, p_i = max_{j<=i} min_{k>=i} mean_w(y_j..y_k), at the
    distinct x (ties pooled first): O(n^3), independent of PAV."""
    u = np.unique(x)
    yy = np.array([np.sum((w * y)[x == v]) for v in u])
    ww = np.array([np.sum(w[x == v]) for v in u])
    n = len(u)
    return u, np.array(
        [
            max(min(yy[j : k + 1].sum() / ww[j : k + 1].sum() for k in range(i, n)) for j in range(i + 1))
            for i in range(n)
        ]
    )


HAND_MADE = [
    ([0.1, 0.2, 0.3, 0.4], [0, 1, 0, 1], None),  # one violation pooled
    ([0.9, 0.1, 0.5, 0.5, 0.3, 0.7], [1, 0, 1, 0, 1, 0], None),  # ties at 0.5, unsorted input
    ([0.0, 0.2, 0.4, 0.6, 0.8], [1, 1, 0, 0, 0], None),  # decreasing data: one block, the mean
    ([-0.5, 0.0, 0.5, 0.7], [0, 1, 0, 1], [1.0, 3.0, 1.0, 2.0]),  # weighted
    ([0.3, 0.3, 0.3], [1, 1, 1], None),  # one distinct score
]


@pytest.mark.parametrize("scores,relevant,weights", HAND_MADE)
def test_fit_equals_brute_force_isotonic(scores, relevant, weights):
    s, y = np.array(scores), np.array(relevant, float)
    w = np.ones_like(s) if weights is None else np.array(weights)
    pmap = fit_scores(s, y, weights)
    u, want = brute_isotonic(s, y, w)
    np.testing.assert_allclose(pmap(u), want, atol=1e-12)
    assert pmap.num_pairs == int(w.sum())


def test_map_is_monotone_within_unit_interval_and_round_trips():
    rng = np.random.default_rng(0)
    s = rng.normal(size=5000)
    y = (rng.random(5000) < 1 / (1 + np.exp(-4 * s))).astype(float)
    pmap = fit_scores(s, y)
    grid = np.linspace(-6, 6, 2001)  # beyond the data too: clipped to the end values
    p = pmap(grid)
    assert np.all(np.diff(p) >= 0) and p.min() >= 0 and p.max() <= 1
    assert p[0] == pmap.knots_y[0] and p[-1] == pmap.knots_y[-1]
    back = ProbabilityMap.from_json(pmap.to_json())
    np.testing.assert_allclose(back(grid), p, atol=1e-5)  # knots stored to 7 decimals
    with pytest.raises(ValueError, match="non-decreasing"):
        ProbabilityMap.from_json({**pmap.to_json(), "knots_y": pmap.to_json()["knots_y"][::-1]})
    with pytest.raises(ValueError, match="0/1"):
        fit_scores([0.1, 0.2], [0, 2])


def split(seed, n_query=12, n_doc=30, dim=8):
    rng = np.random.default_rng(seed)
    d = rng.normal(size=(n_doc, dim)).astype(np.float32)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    doc_ids = np.arange(n_doc) // 2  # two relevant images per id
    query_ids = rng.integers(0, n_doc // 2 + 3, n_query)  # some queries without a relevant image
    q = rng.normal(size=(n_query, dim)).astype(np.float32) * 0.5
    q += np.array([d[doc_ids == i].sum(0) if np.any(doc_ids == i) else np.zeros(dim) for i in query_ids], np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q, d, query_ids, doc_ids


def test_binned_fit_equals_the_fit_on_every_pair():
    """With bins finer than the gap between any two scores, each bin holds one distinct score and the binned fit
    (streamed in row blocks) is the fit on the raw pairs."""
    q, d, qi, di = split(1)
    scores = (q @ d.T).reshape(-1)
    rel = (qi[:, None] == di[None, :]).reshape(-1).astype(float)
    bins = 1 << 22
    cells = np.clip(((scores + 1.0) * (bins / 2.0)).astype(np.int64), 0, bins - 1)
    assert len(np.unique(cells)) == len(np.unique(scores))  # precondition of the test
    binned = fit_probability_map(q, d, qi, di, num_bins=bins, block_size=5)
    raw = fit_scores(scores, rel)
    np.testing.assert_allclose(binned(scores), raw(scores), atol=1e-6)  # BLAS may round a block differently
    assert binned.num_pairs == len(scores) and binned.num_positives == int(rel.sum())


def test_reliability_matches_a_float64_reference():
    q, d, qi, di = split(2)
    pmap = fit_probability_map(*split(3))  # fitted on another split: not perfectly calibrated here
    out = reliability(pmap, q, d, qi, di, num_bins=10, block_size=4)
    p = pmap((q.astype(np.float64) @ d.T.astype(np.float64)).reshape(-1))
    rel = (qi[:, None] == di[None, :]).reshape(-1)
    b = np.minimum((p * 10).astype(int), 9)
    ece = sum(abs(rel[b == k].sum() - p[b == k].sum()) for k in range(10)) / len(p)
    assert out["ece"] == pytest.approx(ece, abs=1e-6)
    assert out["bins"]["count"] == np.bincount(b, minlength=10).tolist()
    nrel = (qi[:, None] == di[None, :]).sum(1)
    assert {k: v["num_queries"] for k, v in out["ece_by_group"].items()} == {
        str(k): int(np.sum(nrel == k)) for k in np.unique(nrel)
    }
    top = (q.astype(np.float64) @ d.T.astype(np.float64)).max(1)
    q4 = out["ece_by_top_score"]["Q4 (highest)"]
    high = top > np.quantile(top, 0.75)
    ph, rh = p.reshape(len(q), -1)[high].ravel(), rel.reshape(len(q), -1)[high].ravel()
    bh = np.minimum((ph * 10).astype(int), 9)
    want = sum(abs(rh[bh == k].sum() - ph[bh == k].sum()) for k in range(1, 10)) / max(1, np.sum(bh >= 1))
    assert q4["num_queries"] == int(high.sum()) and q4["ece_top"] == pytest.approx(want, abs=1e-6)
    assert 0 <= out["ece"] <= 1


def test_perfectly_calibrated_constant_map_has_zero_error():
    q, d, qi, di = split(4)
    share = float(np.mean(qi[:, None] == di[None, :]))
    flat = ProbabilityMap(np.array([0.0]), np.array([share]))
    assert reliability(flat, q, d, qi, di)["ece"] == pytest.approx(0.0, abs=1e-12)


def test_evaluation_and_report_carry_the_map_calibration(tmp_path):
    """evaluate_embeddings measures a given map (ECE, Brier skill in the summary); the report prints CE and SS side
    by side (skills, confident pairs, per-query errors) and plots their reliability diagrams."""
    from PIL import Image

    from ce_retrieval.evaluation.evaluate import evaluate_embeddings, summary
    from ce_retrieval.evaluation.probability_report import format_probability, plot_probability_report

    q, d, qi, di = split(5)
    pmap = fit_probability_map(*split(6))
    metrics = evaluate_embeddings(q, d, qi, di, probability_map=pmap)
    assert metrics["probability"] == reliability(pmap, q, d, qi, di)
    s = summary(metrics)
    assert s["probability_ece"] == metrics["probability"]["ece"]
    assert evaluate_embeddings(q, d, qi, di)["probability"] is None
    other = reliability(fit_probability_map(*split(7)), q, d, qi, di)
    docs = [
        {"run_name": "CrossExampleSoftmax", "metrics": {"probability": metrics["probability"]}},
        {"run_name": "SampledSoftmax", "metrics": {"probability": other}},
        {"run_name": "SampledSoftmax", "metrics": {"probability": metrics["probability"]}},
    ]
    table = format_probability(docs)
    ce_rows = [line for line in table.splitlines() if line.startswith("| CrossExampleSoftmax")]
    assert len(ce_rows) == 2  # the scores table and the per-query table
    assert f"| CrossExampleSoftmax | 1 | {100 * s['probability_brier_skill']:.2f} |" in ce_rows[0]
    assert f"{100 * s['probability_query_error']:.1f} ({100 * s['probability_query_error_floor']:.1f})" in ce_rows[1]
    assert "| SampledSoftmax | 2 |" in table and "top score Q4 (highest)" in table
    old = {"ece": 0.001, "ece_top": 0.03, "ece_by_group": {}, "ece_by_top_score": {}, "bins": {}}  # before these
    assert "| old | 1 | – | – |" in format_probability([{"run_name": "old", "metrics": {"probability": old}}])
    assert format_probability([{"run_name": "x", "metrics": {}}]) is None
    path = plot_probability_report(docs, str(tmp_path / "prob.png"))
    with Image.open(path) as img:
        assert img.format == "PNG"
