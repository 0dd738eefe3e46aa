"""Brier score, log loss and Murphy's decomposition (ce_retrieval/evaluation/proper_scores.py): equal to
scikit-learn's scores and to a per-bin float64 reference, the decomposition identity exact, streaming equal to one
shot, the skills 0 for the base rate and 1 for a perfect forecast."""

import numpy as np
import pytest
from sklearn.metrics import brier_score_loss, log_loss

from ce_retrieval.evaluation.proper_scores import LOG_LOSS_CLIP, ProperScores, proper_scores


def forecasts(seed, n=4000):
    """Predictions in [0.001, 0.999] (inside the log-loss clip) and outcomes drawn from a distorted version."""
    rng = np.random.default_rng(seed)
    p = 0.001 + 0.998 * rng.random(n) ** 2
    y = (rng.random(n) < np.sqrt(p)).astype(int)
    return p, y


def binned_reference(p, y, num_bins):
    """Murphy's terms by a loop over bins (float64), independent of the streamed sums."""
    b = np.minimum((p * num_bins).astype(int), num_bins - 1)
    o, n = y.mean(), len(p)
    rel = res = wbv = wbc = 0.0
    for k in np.unique(b):
        pk, yk = p[b == k], y[b == k]
        rel += len(pk) * (pk.mean() - yk.mean()) ** 2 / n
        res += len(pk) * (yk.mean() - o) ** 2 / n
        wbv += np.sum((pk - pk.mean()) ** 2) / n
        wbc += np.sum((pk - pk.mean()) * (yk - yk.mean())) / n
    return {"reliability": rel, "resolution": res, "within_bin_variance": wbv, "within_bin_covariance": wbc}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_brier_and_log_loss_equal_scikit_learn(seed):
    p, y = forecasts(seed)
    out = proper_scores(p, y)
    assert out["brier"] == pytest.approx(brier_score_loss(y, p), rel=1e-12)
    assert out["log_loss"] == pytest.approx(log_loss(y, p), rel=1e-12)
    assert out["num_pairs"] == len(p) and out["base_rate"] == pytest.approx(y.mean())


@pytest.mark.parametrize("num_bins", [10, 1000])
def test_decomposition_equals_a_per_bin_reference_and_sums_to_the_brier_score(num_bins):
    p, y = forecasts(3)
    out = proper_scores(p, y, num_bins=num_bins)
    want = binned_reference(p, y, num_bins)
    for key, value in want.items():
        assert out[key] == pytest.approx(value, rel=1e-9, abs=1e-15), key
    assert out["uncertainty"] == pytest.approx(y.mean() * (1 - y.mean()))
    total = (
        out["reliability"]
        - out["resolution"]
        + out["uncertainty"]
        + out["within_bin_variance"]
        - 2 * out["within_bin_covariance"]
    )
    assert total == pytest.approx(out["brier"], rel=1e-10)


def test_decomposition_is_rel_minus_res_plus_unc_when_each_bin_holds_one_prediction():
    """A piecewise-flat forecast (a few distinct values, each alone in its bin): the within-bin terms vanish and
    REL - RES + UNC is the Brier score, with REL and RES over the distinct values."""
    rng = np.random.default_rng(4)
    values = np.array([0.0123, 0.0871, 0.2345, 0.5555, 0.9012])
    p = values[rng.integers(0, len(values), 3000)]
    y = (rng.random(3000) < p * 0.8 + 0.05).astype(int)
    out = proper_scores(p, y)
    assert out["within_bin_variance"] == pytest.approx(0.0, abs=1e-15)
    assert out["within_bin_covariance"] == pytest.approx(0.0, abs=1e-15)
    o = y.mean()
    rel = sum(np.sum(p == v) * (v - y[p == v].mean()) ** 2 for v in values) / len(p)
    res = sum(np.sum(p == v) * (y[p == v].mean() - o) ** 2 for v in values) / len(p)
    assert out["reliability"] == pytest.approx(rel, rel=1e-10) and out["resolution"] == pytest.approx(res, rel=1e-10)
    assert out["reliability"] - out["resolution"] + out["uncertainty"] == pytest.approx(out["brier"], rel=1e-10)


def test_streamed_blocks_equal_one_shot():
    p, y = forecasts(5)
    acc = ProperScores()
    for part in np.array_split(np.arange(len(p)), 7):
        acc.add(p[part], y[part])
    streamed, once = acc.result(), proper_scores(p, y)
    assert streamed.keys() == once.keys()
    for key in once:
        assert streamed[key] == pytest.approx(once[key], rel=1e-10, abs=1e-18), key


def test_log_loss_clips_certain_predictions():
    """p = 0 for a relevant pair and 1 for an irrelevant one cost -log(1e-7) each, not infinity."""
    p, y = np.array([0.0, 1.0, 0.5, 0.25]), np.array([1, 0, 1, 0])
    c = np.clip(p, LOG_LOSS_CLIP, 1 - LOG_LOSS_CLIP)
    want = -np.mean(y * np.log(c) + (1 - y) * np.log(1 - c))
    assert proper_scores(p, y)["log_loss"] == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(-(2 * np.log(1e-7) + np.log(0.5) + np.log(0.75)) / 4, rel=1e-9)


def test_skill_is_zero_for_the_base_rate_and_one_for_a_perfect_forecast():
    rng = np.random.default_rng(6)
    y = (rng.random(5000) < 0.02).astype(int)
    base = proper_scores(np.full(len(y), y.mean()), y)
    assert base["brier_skill"] == pytest.approx(0.0, abs=1e-12)
    assert base["log_loss_skill"] == pytest.approx(0.0, abs=1e-12)
    assert base["resolution"] == pytest.approx(0.0, abs=1e-15)
    perfect = proper_scores(y.astype(float), y)
    assert perfect["brier"] == 0.0 and perfect["brier_skill"] == 1.0
    assert perfect["log_loss_skill"] == pytest.approx(1.0, abs=1e-4)  # clipped at 1e-7, not exactly 0 loss
    assert proper_scores(np.full(10, 0.3), np.zeros(10))["brier_skill"] is None  # one outcome: no uncertainty


def test_rejects_what_is_not_a_probability_and_reports_nothing_without_pairs():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        proper_scores([0.2, 1.2], [0, 1])
    with pytest.raises(ValueError, match="must match"):
        proper_scores([0.2, 0.3], [0, 1, 1])
    empty = ProperScores().result()
    assert empty["num_pairs"] == 0 and empty["brier"] is None and empty["log_loss_skill"] is None
