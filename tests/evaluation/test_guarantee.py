"""Guaranteed thresholds (evaluation.guarantee): the bounds against outside code, the point estimate against the
global PR curve, and the promise itself on a generated score model whose truth is known."""

import numpy as np
import pytest
from scipy import stats

from ce_retrieval.evaluation.calibration import global_pr_auc
from ce_retrieval.evaluation.guarantee import (
    ScoreRates,
    guaranteed_thresholds,
    measure_rates,
    precision_at_size,
    rates_from_scores,
)
from ce_retrieval.utils.proportions import clopper_pearson

# A two-way random-effects score model: s_ij = mu + a_i + b_j + e_ij (query effect a, image effect b), so the
# pairs of one caption and of one image are correlated, as real scores are. Marginally Gaussian: the true rates,
# and so the true precision at any gallery size (eq. 1), are known in closed form.
MU0, MU1, SA, SB, SE, SP = 0.0, 0.55, 0.06, 0.06, 0.08, 0.1
SIG0, SIG1 = np.hypot(np.hypot(SA, SB), SE), np.hypot(np.hypot(SA, SB), SP)
LEVELS = (0.5, 0.8, 0.9)


def true_precision(t, gallery_size, r=1.0):
    return precision_at_size(stats.norm.sf((t - MU1) / SIG1), stats.norm.sf((t - MU0) / SIG0), gallery_size, r)


def draw(rng, units=200, captions=2, images=200):
    a = rng.normal(0, SA, units * captions)
    b = rng.normal(0, SB, images)
    s = MU0 + a[:, None] + b[None, :] + rng.normal(0, SE, (units * captions, images))
    qids = np.repeat(np.arange(units), captions)
    s[np.arange(len(qids)), qids] = MU1 + a + b[qids] + rng.normal(0, SP, len(qids))
    return s, qids, np.arange(images)


def promises_kept(draws: int, served: int, key: str, seed: int = 0) -> tuple[float, float]:
    """Share of validation draws whose every threshold (all levels at once) keeps its promise on the population,
    and the share of levels that got a threshold."""
    rng = np.random.default_rng(seed)
    kept, given = 0, 0
    for _ in range(draws):
        out = guaranteed_thresholds(rates_from_scores(*draw(rng)), LEVELS, 0.1, gallery_size=served)
        taus = out["threshold_at_precision"] if key == "guaranteed" else out["estimated"]["threshold_at_precision"]
        ok = True
        for p in LEVELS:
            t = taus[f"{p:g}"]
            if t is not None:
                given += 1
                ok &= bool(true_precision(t, served) >= p)
        kept += ok
    return kept / draws, given / (draws * len(LEVELS))


@pytest.mark.slow
@pytest.mark.parametrize("served", [200, 2000])
def test_promises_hold_with_the_stated_confidence(served):
    kept, given = promises_kept(1000, served, "guaranteed")
    assert kept >= 1 - 0.1 - 0.02
    assert given > 0.15  # the guarantee is not kept by refusing everything


def test_the_point_estimate_breaks_its_promise_often():
    """The winner's curse the guarantee exists for: the same draws, the validation curve's own threshold."""
    kept, _ = promises_kept(300, 200, "estimated")
    assert kept < 0.8


def test_clopper_pearson_equals_scipy_exact_interval():
    for x, n in [(0, 50), (3, 50), (17, 40), (40, 40), (120, 10_000)]:
        alpha = 0.01
        lo, hi = stats.binomtest(x, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact")
        assert clopper_pearson(x, n, alpha, upper=False) == pytest.approx(lo, abs=1e-12)
        assert clopper_pearson(x, n, alpha, upper=True) == pytest.approx(hi, abs=1e-12)


def _embeddings(seed=0, images=120, captions=3, dim=16, noise=1.0):
    rng = np.random.default_rng(seed)
    img = rng.normal(size=(images, dim))
    img /= np.linalg.norm(img, axis=1, keepdims=True)
    cap = np.repeat(img, captions, 0) + noise * rng.normal(size=(images * captions, dim)) / np.sqrt(dim)
    cap /= np.linalg.norm(cap, axis=1, keepdims=True)
    return cap.astype(np.float32), img.astype(np.float32), np.repeat(np.arange(images), captions), np.arange(images)


def test_estimate_at_the_validation_size_is_the_global_pr_threshold():
    q, d, qi, di = _embeddings()
    want = global_pr_auc(q, d, qi, di, target_precisions=LEVELS)["threshold_at_precision"]
    got = guaranteed_thresholds(measure_rates(q, d, qi, di, block_size=7), LEVELS)["estimated"][
        "threshold_at_precision"
    ]
    # The same pair's score from a 7-row block and from the whole matrix may differ in the last float32 bit (the
    # matmul's blocking follows its shape and thread count), so the thresholds agree to float32 rounding.
    assert got.keys() == want.keys()
    for level, t in want.items():
        assert (got[level] is None) == (t is None)
        if t is not None:
            assert got[level] == pytest.approx(t, rel=2e-7, abs=2e-7)


def test_counts_match_brute_force():
    q, d, qi, di = _embeddings(1)
    rates = measure_rates(q, d, qi, di, grid_size=16, block_size=50)
    s = q @ d.T
    rel = qi[:, None] == di[None, :]
    for t, tp, fp in zip(rates.thresholds, rates.tp, rates.fp, strict=True):
        assert tp == np.sum(rel & (s >= t)) and fp == np.sum(~rel & (s >= t))
    assert np.all(np.diff(rates.thresholds) < 0) and np.all(rates.deff_tp >= 1) and np.all(rates.deff_fp >= 1)
    assert rates.num_positives == rel.sum() and rates.num_negatives == (~rel).sum()
    back = ScoreRates.from_json(rates.to_json())
    np.testing.assert_array_equal(back.tp, rates.tp)
    assert guaranteed_thresholds(back) == guaranteed_thresholds(rates)


def test_clustered_pairs_widen_the_bound():
    """Query effects make a caption's pairs move together: the design effect of the irrelevant rate grows."""
    rng = np.random.default_rng(3)
    s, qi, di = draw(rng)
    s_clustered = s + rng.normal(0, 0.2, (len(qi), 1))  # a strong per-query shift
    assert np.median(rates_from_scores(s_clustered, qi, di).deff_fp) > np.median(rates_from_scores(s, qi, di).deff_fp)


def test_independent_pairs_have_no_design_effect():
    """Every pair independent (no query or image effect): the two cluster sums each hold the pairs' binomial
    variance once, and the two-way form subtracts it once, so the design effect is about 1, not 2."""
    rng = np.random.default_rng(5)
    s = rng.normal(0.0, 0.1, (600, 300))
    qi = np.arange(600) % 300
    s[np.arange(600), qi] = 0.3 + rng.normal(0.0, 0.1, 600)
    rates = rates_from_scores(s, qi, np.arange(300))
    enough = (rates.fp >= 50) & (rates.fp <= rates.num_negatives - 50)
    assert enough.sum() >= 10
    assert np.median(rates.deff_fp[enough]) < 1.3  # 2.0 when the binomial variance was counted twice


def test_a_larger_gallery_needs_a_higher_threshold_or_is_refused():
    q, d, qi, di = _embeddings(noise=0.6)
    rates = measure_rates(q, d, qi, di)
    small = guaranteed_thresholds(rates, LEVELS)
    large = guaranteed_thresholds(rates, LEVELS, gallery_size=100 * len(d))
    for key, t in small["threshold_at_precision"].items():
        t_large = large["threshold_at_precision"][key]
        assert t is not None and (t_large is None or t_large >= t)
    huge = guaranteed_thresholds(rates, LEVELS, gallery_size=10**9)
    refused = huge["levels"]["0.9"]
    assert huge["threshold_at_precision"]["0.9"] is None and "cannot certify precision 0.9" in refused["refused"]
    assert huge["gallery_size"] == 10**9 and huge["delta"] == 0.1 and huge["num_calibration_queries"] == len(q)


def test_bad_arguments_are_named():
    q, d, qi, di = _embeddings()
    rates = measure_rates(q, d, qi, di)
    with pytest.raises(ValueError, match="delta"):
        guaranteed_thresholds(rates, delta=1.5)
    with pytest.raises(ValueError, match="relevant_per_query"):
        guaranteed_thresholds(rates, relevant_per_query=0)
    with pytest.raises(ValueError, match="levels"):
        guaranteed_thresholds(rates, levels=(1.2,))
    with pytest.raises(ValueError, match="no positive pairs"):
        measure_rates(q, d, qi + 10_000, di)
    with pytest.raises(ValueError, match="shape"):
        rates_from_scores(np.zeros(3), [1], [1])
