"""The probability figures that separate two maps (``reliability`` in ce_retrieval/evaluation/probability.py):
proper scores and confident pairs against a brute force over all pairs and scikit-learn, the ECE and the per-query
errors against netcal, per-query errors that do not cancel where pooled ones do, the noise floor reproduced from its
draws, caption-length groups, and the summary keys."""

import numpy as np
import pytest
from netcal.metrics import ECE
from sklearn.metrics import brier_score_loss, log_loss

from ce_retrieval.evaluation.evaluate import evaluate_embeddings, probability_summary, summary
from ce_retrieval.evaluation.probability import (
    CONFIDENT_LEVELS,
    FLOOR_DRAWS,
    ProbabilityMap,
    caption_word_counts,
    reliability,
)
from ce_retrieval.evaluation.proper_scores import proper_scores


def split(seed, n_query=40, n_doc=50, dim=6):
    """Unit embeddings; each image id has 1-3 images, some queries have none (0 relevant)."""
    rng = np.random.default_rng(seed)
    d = rng.normal(size=(n_doc, dim)).astype(np.float32)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    doc_ids = np.sort(rng.integers(0, n_doc // 2, n_doc))
    query_ids = rng.integers(0, n_doc // 2 + 4, n_query)
    q = rng.normal(size=(n_query, dim)).astype(np.float32) * 0.6
    q += np.array([d[doc_ids == i].sum(0) for i in query_ids], np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q, d, query_ids, doc_ids


def random_map(seed, knots=7):
    """A monotone map with generic knot values (its outputs avoid the diagram's bin edges)."""
    rng = np.random.default_rng(seed)
    y = np.sort(np.append(rng.uniform(0.0, 0.9, knots - 1), 0.9713))
    return ProbabilityMap(np.sort(rng.uniform(-0.5, 0.8, knots)), y)


def all_pairs(pmap, q, d, qi, di):
    """p [N, M] from the float32 scores the code uses, and relevance [N, M]."""
    return pmap(q @ d.T), qi[:, None] == di[None, :]


def off_edges(p, edges):
    return np.min(np.abs(p.reshape(-1, 1) - np.asarray(edges)[None, :])) > 1e-6


def test_scores_and_confident_pairs_equal_a_brute_force_over_all_pairs():
    q, d, qi, di = split(0)
    pmap = random_map(1)
    out = reliability(pmap, q, d, qi, di, block_size=3)
    p, rel = all_pairs(pmap, q, d, qi, di)
    assert off_edges(p, CONFIDENT_LEVELS)  # precondition: no prediction on a level
    p, y = p.reshape(-1), rel.reshape(-1).astype(int)
    scores = out["scores"]
    assert scores["brier"] == pytest.approx(brier_score_loss(y, p), rel=1e-6)
    assert scores["log_loss"] == pytest.approx(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7)), rel=1e-6)
    want = proper_scores(p, y)
    for key in ("reliability", "resolution", "uncertainty", "brier_skill", "log_loss_skill"):
        assert scores[key] == pytest.approx(want[key], rel=1e-6, abs=1e-12), key
    for level in CONFIDENT_LEVELS:
        at = p >= level
        got = out["confident"][f"{level:g}"]
        assert got["num_pairs"] == int(at.sum()) > 0
        assert got["precision"] == pytest.approx(y[at].mean()) and got["mean_predicted"] == pytest.approx(p[at].mean())


def test_ece_pooled_groups_and_per_query_errors_equal_netcal():
    """netcal's binned ECE (10 equal bins, positive-class probability) over all pairs, over each relevant-count
    group's pairs, and per query over its pairs predicted >= 0.1, whose mean over a group is the group's error."""
    q, d, qi, di = split(2, n_query=60)
    pmap = random_map(3)
    out = reliability(pmap, q, d, qi, di, num_bins=10, block_size=7)
    p, rel = all_pairs(pmap, q, d, qi, di)
    assert off_edges(p, np.arange(11) / 10)  # precondition: bin edges are where libraries may differ
    y = rel.astype(int)
    assert out["ece"] == pytest.approx(ECE(bins=10).measure(p.reshape(-1), y.reshape(-1)), abs=1e-6)
    nrel = rel.sum(1)
    for group, got in out["ece_by_group"].items():
        rows = np.minimum(nrel, 5) == (5 if group == "5+" else int(group))
        want = ECE(bins=10).measure(p[rows].reshape(-1), y[rows].reshape(-1))
        assert got["num_queries"] == int(rows.sum()) and got["ece"] == pytest.approx(want, abs=1e-6), group
    per_query = np.full(len(q), np.nan)
    for i in range(len(q)):
        top = p[i] >= 0.1
        if top.any():
            per_query[i] = ECE(bins=10).measure(p[i, top], y[i, top])
    measured = ~np.isnan(per_query)
    assert out["per_query"]["all"]["num_measured"] == int(measured.sum()) > 10
    assert out["per_query"]["all"]["error"] == pytest.approx(per_query[measured].mean(), abs=1e-6)
    for group, got in out["per_query"]["by_relevant"].items():
        rows = (np.minimum(nrel, 5) == (5 if group == "5+" else int(group))) & measured
        assert got["num_measured"] == int(rows.sum())
        assert got["error"] == (pytest.approx(per_query[rows].mean(), abs=1e-6) if rows.any() else None)


def test_per_query_errors_do_not_cancel_where_pooled_ones_do():
    """Two queries, every pair predicted 0.5: query A finds 30 of its 40 images relevant, query B 10. Pooled, the
    observed share is 0.5 = predicted (ECE 0); per query each is off by 0.25."""
    q = np.ones((2, 1), np.float32)
    d = np.full((40, 1), 0.5, np.float32)
    doc_ids = np.array([0] * 30 + [1] * 10)
    flat = ProbabilityMap(np.array([0.0]), np.array([0.5]))
    out = reliability(flat, q, d, np.array([0, 1]), doc_ids, caption_lengths=[7, 8])
    assert out["ece"] == pytest.approx(0.0) and out["ece_top"] == pytest.approx(0.0)
    assert out["ece_by_group"]["5+"]["ece_top"] == pytest.approx(0.0)
    for group in (out["per_query"]["all"], out["per_query"]["by_relevant"]["5+"]):
        assert group["num_queries"] == group["num_measured"] == 2 and group["error"] == pytest.approx(0.25)
    assert out["per_query"]["by_caption_length"] == {"6-8": out["per_query"]["all"]}
    assert out["per_query"]["all"]["floor"] < 0.15  # 40 pairs at 0.5: E|Bin(40, 0.5) - 20| / 40 = 0.063
    assert out["confident"]["0.5"] == {"num_pairs": 80, "precision": 0.5, "mean_predicted": 0.5}
    assert out["confident"]["0.9"] == {"num_pairs": 0, "precision": None, "mean_predicted": None}


def test_floor_is_the_mean_error_of_outcomes_drawn_from_the_predictions():
    """Reproduced from the same draws: rng.random((pairs predicted >= 0.1, FLOOR_DRAWS)) in row-major pair order,
    for any block size."""
    q, d, qi, di = split(4)
    pmap = random_map(5)
    p, _ = all_pairs(pmap, q, d, qi, di)
    b = np.minimum((p * 10).astype(int), 9)
    top = b >= 1
    u = np.random.default_rng(11).random((int(top.sum()), FLOOR_DRAWS))
    drawn = np.zeros((FLOOR_DRAWS,) + p.shape)
    drawn[:, top] = (u < p[top][:, None]).T
    floors = []
    for i in range(len(q)):
        if top[i].any():
            err = [
                sum(abs(drawn[t, i][b[i] == k].sum() - p[i][b[i] == k].sum()) for k in range(1, 10)) for t in range(32)
            ]
            floors.append(np.mean(err) / top[i].sum())
    for block in (1, 6, None):
        got = reliability(pmap, q, d, qi, di, block_size=block, seed=11)["per_query"]["all"]
        assert got["num_measured"] == len(floors) and got["floor"] == pytest.approx(np.mean(floors), abs=1e-6)


def test_caption_length_groups():
    assert caption_word_counts(["a red circle", b"two  blue squares here", "  "]).tolist() == [3, 4, 0]
    q, d, qi, di = split(6, n_query=8)
    lengths = [1, 5, 6, 8, 9, 12, 13, 30]
    groups = reliability(random_map(7), q, d, qi, di, caption_lengths=lengths)["per_query"]["by_caption_length"]
    assert {g: v["num_queries"] for g, v in groups.items()} == {"<=5": 2, "6-8": 2, "9-12": 2, "13-17": 1, "18+": 1}
    with pytest.raises(ValueError, match="caption_lengths"):
        reliability(random_map(7), q, d, qi, di, caption_lengths=[3, 4])


def test_summary_carries_the_separating_figures():
    q, d, qi, di = split(8)
    pmap = random_map(9)
    metrics = evaluate_embeddings(q, d, qi, di, probability_map=pmap, caption_lengths=np.arange(len(q)) % 20)
    prob, s = metrics["probability"], summary(metrics)
    assert set(prob["per_query"]) == {"all", "by_relevant", "by_top_score", "by_caption_length"}
    assert s["probability_brier"] == prob["scores"]["brier"] and s["probability_log_loss"] == prob["scores"]["log_loss"]
    assert s["probability_brier_skill"] == prob["scores"]["brier_skill"]
    assert s["probability_pairs_ge_0.9"] == prob["confident"]["0.9"]["num_pairs"]
    assert s["probability_precision_ge_0.5"] == prob["confident"]["0.5"]["precision"]
    assert s["probability_query_error"] == prob["per_query"]["all"]["error"]
    assert s["probability_query_error_floor"] == prob["per_query"]["all"]["floor"]
    assert set(probability_summary(None).values()) == {None}  # no map: every figure None
    old = probability_summary({"ece": 0.001, "ece_top": 0.03})  # a JSON written before these figures
    assert old["probability_ece"] == 0.001 and old["probability_brier"] is None
