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
    ratio_pvalues,
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


def promises_kept(draws: int, served_sizes, key: str, seed: int = 0) -> dict:
    """Per served gallery size: the share of validation draws whose every threshold (all levels at once) keeps its
    promise on the population, and the share of levels that got a threshold (the same draws for every size)."""
    rng = np.random.default_rng(seed)
    kept, given = dict.fromkeys(served_sizes, 0), dict.fromkeys(served_sizes, 0)
    for _ in range(draws):
        rates = rates_from_scores(*draw(rng))
        for served in served_sizes:
            out = guaranteed_thresholds(rates, LEVELS, 0.1, gallery_size=served)
            taus = out["threshold_at_precision"] if key == "guaranteed" else out["estimated"]["threshold_at_precision"]
            ok = True
            for p in LEVELS:
                t = taus[f"{p:g}"]
                if t is not None:
                    given[served] += 1
                    ok &= bool(true_precision(t, served) >= p)
            kept[served] += ok
    return {m: (kept[m] / draws, given[m] / (draws * len(LEVELS))) for m in served_sizes}


@pytest.mark.slow
def test_promises_hold_with_the_stated_confidence():
    """1,000 validation draws served on a gallery of the validation's size; the first 400 of them also on one ten
    times larger."""
    for served, draws in ((200, 1000), (2000, 400)):
        kept, given = promises_kept(draws, (served,), "guaranteed")[served]
        assert kept >= 1 - 0.1 - 0.02, served
        assert given > 0.15, served  # the guarantee is not kept by refusing everything


def test_the_point_estimate_breaks_its_promise_often():
    """The winner's curse the guarantee exists for: the same draws, the validation curve's own threshold."""
    kept, _ = promises_kept(150, (200,), "estimated")[200]
    assert kept < 0.8


def test_clopper_pearson_equals_scipy_exact_interval():
    for x, n in [(0, 50), (3, 50), (17, 40), (40, 40), (120, 10_000)]:
        alpha = 0.01
        lo, hi = stats.binomtest(x, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact")
        assert clopper_pearson(x, n, alpha, upper=False) == pytest.approx(lo, abs=1e-12)
        assert clopper_pearson(x, n, alpha, upper=True) == pytest.approx(hi, abs=1e-12)


@pytest.mark.parametrize(
    "k, n, f, n_neg, c",
    [(40, 300, 25, 29_700, 0.01), (5, 300, 0, 29_700, 0.001), (2, 60, 3, 5_000, 0.05), (1, 300, 0, 29_700, 0.5),
     (150.5, 400.2, 80.3, 50_000.0, 0.003), (280, 300, 500, 29_700, 0.02), (64, 64, 200, 6_000, 0.05)],
)  # fmt: skip
def test_ratio_pvalue_bounds_the_integral_from_above(k, n, f, n_neg, c):
    """Eq. (3) against adaptive quadrature of the same integral: never below it, at most 8 % above."""
    from scipy import integrate, special

    def integrand(u):
        return stats.beta.pdf(u, k, n - k + 1) * (special.betainc(n_neg - f, f + 1, 1 - c * u) if c * u < 1 else 0.0)

    kinks = [k / n, min(1, f / n_neg / c)]
    exact = integrate.quad(integrand, 0, 1, epsabs=1e-15, epsrel=1e-10, limit=1000, points=kinks)[0]
    got = ratio_pvalues([k], [n], [f], [n_neg], [c])[0, 0]
    assert exact <= got <= 1.08 * exact + 1e-12


def test_the_ratio_test_has_its_size_where_it_is_hardest():
    """The least favourable ROC for eq. (3) is a line just above the tested ratio, FPR = c (1 + eps) TPR: there
    the precision is below the level at every threshold, so every pass is a broken promise. One candidate (the
    30th highest of 100 relevant scores), 20,000 draws: the test passes in at most alpha of them, and in more
    than 0.6 alpha (the bound is tight, not vacuous)."""
    rng = np.random.default_rng(11)
    k, n, n_neg, alpha, draws, rho = 30, 100, 5_000, 0.05, 20_000, 0.05
    tpr = 1.0 - np.sort(rng.uniform(0, 1, (draws, n)), axis=1)[:, n - k]  # relevant scores uniform: TPR = 1 - t
    fp = rng.binomial(n_neg, rho * tpr)  # irrelevant: uniform with probability rho, else below every threshold
    passed = ratio_pvalues(np.full(draws, k), np.full(draws, n), fp, np.full(draws, n_neg), [rho / 1.001])[:, 0]
    share = np.mean(passed <= alpha)
    assert 0.6 * alpha < share <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / draws)


def test_the_ratio_test_certifies_more_than_two_separate_bounds():
    """Independent Gaussian scores, the same candidate, the ratio at the median of its true FPR / TPR: the test
    passes whenever bounding TPR and FPR separately (alpha / 2 each, the library's form before 2026-11-29) does,
    and about three times as often; it never passes where the true ratio is above c more than alpha allows."""
    rng = np.random.default_rng(11)
    k, n, n_neg, alpha, draws = 30, 100, 5_000, 0.05, 4_000
    t = np.sort(rng.normal(1.0, 1.0, (draws, n)), axis=1)[:, n - k]  # the k-th highest relevant score
    tpr, fpr = stats.norm.sf(t - 1.0), stats.norm.sf(t)
    fp = rng.binomial(n_neg, fpr)  # the irrelevant pairs above it, given the threshold
    c = float(np.median(fpr / tpr))
    passed = ratio_pvalues(np.full(draws, k), np.full(draws, n), fp, np.full(draws, n_neg), [c])[:, 0] <= alpha
    separate = clopper_pearson(fp, n_neg, alpha / 2, upper=True) <= c * clopper_pearson(k, n, alpha / 2, upper=False)
    assert np.all(passed >= separate) and passed.sum() > 2 * separate.sum()
    assert np.mean((fpr / tpr > c) & passed) <= alpha


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


def test_promises_hold_on_a_served_gallery_that_is_itself_a_draw():
    """Strong image effects (sigma_b 0.1 against noise 0.05): the served gallery, 200 images drawn like the
    validation's, has its own rates. Its true precision (new queries, its images' effects fixed) is in closed
    form; every promise holds on it in at least 1 - delta - 0.02 of 300 draws, and some are made."""
    sa, sb, se, mu1, images = 0.06, 0.1, 0.05, 0.55, 200
    rng = np.random.default_rng(21)
    kept = made = 0
    for _ in range(300):
        a, b = rng.normal(0, sa, images * 2), rng.normal(0, sb, images)
        s = a[:, None] + b[None, :] + rng.normal(0, se, (images * 2, images))
        qids = np.repeat(np.arange(images), 2)
        s[np.arange(len(qids)), qids] = mu1 + a + b[qids] + rng.normal(0, se, len(qids))
        taus = guaranteed_thresholds(rates_from_scores(s, qids, np.arange(images)), LEVELS, 0.1)
        served = rng.normal(0, sb, images)  # the served gallery's own images
        ok = True
        for p, t in taus["threshold_at_precision"].items():
            if t is not None:
                made += 1
                tpr = stats.norm.sf((t - mu1 - served) / np.hypot(sa, se)).mean()
                fpr = stats.norm.sf((t - served) / np.hypot(sa, se)).mean()
                ok &= bool(precision_at_size(tpr, fpr, images, 1.0) >= float(p))
        kept += ok
    assert kept / 300 >= 1 - 0.1 - 0.02 and made >= 100


def test_a_calibration_stored_without_the_gallery_term_is_read_conservatively():
    """Manifests written before ``deff_fp_gallery`` was stored load, and take the whole design effect in its place:
    never a lower threshold than the full calibration's."""
    rng = np.random.default_rng(4)
    rates = rates_from_scores(*draw(rng))
    assert rates.deff_fp_gallery is not None and np.all(rates.deff_fp_gallery >= 0)
    old = rates.to_json()
    del old["deff_fp_gallery"]
    back = ScoreRates.from_json(old)
    assert back.deff_fp_gallery is None
    new_t = guaranteed_thresholds(rates, LEVELS)["threshold_at_precision"]
    old_t = guaranteed_thresholds(back, LEVELS)["threshold_at_precision"]
    assert any(t is not None for t in old_t.values())
    for key, t in old_t.items():
        assert t is None or (new_t[key] is not None and t >= new_t[key])


def test_the_gallery_term_is_about_zero_for_independent_pairs_and_large_for_clustered_ones():
    """The served gallery's term is the image sum's variance beyond the pairs' own binomial variance: about 0 where
    every pair is independent, above 1 (in units of the binomial variance) with image effects."""
    rng = np.random.default_rng(6)
    s = rng.normal(0.0, 0.1, (400, 200))
    qi = np.arange(400) % 200
    s[np.arange(400), qi] = 0.35 + rng.normal(0.0, 0.1, 400)
    iid = rates_from_scores(s, qi, np.arange(200))
    assert np.median(iid.deff_fp_gallery) < 0.3
    clustered = rates_from_scores(*draw(rng))
    assert np.median(clustered.deff_fp_gallery) > 1.0
