"""Latent Coincidence Analysis: closed-form likelihood, monotone EM, separation of similar/dissimilar pairs."""

import numpy as np
import pytest

from ce_retrieval.modeling.lca import LatentCoincidenceAnalysis


def _pairs(rng, n=240, classes=5):
    means = 2.0 * rng.normal(size=(classes, 2))

    def sample(labels):
        signal = means[labels] + 0.4 * rng.normal(size=(len(labels), 2))
        return np.concatenate([signal, 3.0 * rng.normal(size=(len(labels), 4))], axis=1)

    a = rng.integers(0, classes, n)
    similar = rng.random(n) < 0.5
    b = np.where(similar, a, (a + rng.integers(1, classes, n)) % classes)
    return sample(a), sample(b), similar


def test_marginal_likelihood_matches_monte_carlo(rng):
    """p(y=1|x,x') = E_{z,z'}[exp(-‖z-z'‖²/2κ²)] under z ~ N(Wx, σ²I): check the closed form by sampling."""
    model = LatentCoincidenceAnalysis(rank=2, sigma2=0.7)
    model._rank = 2
    model.W_ = rng.normal(size=(3, 2))
    model.kappa2_ = 1.3
    x = rng.normal(size=(1, 3))
    xp = x + 0.3 * rng.normal(size=(1, 3))
    z = x @ model.W_ + np.sqrt(0.7) * rng.normal(size=(200_000, 2))
    zp = xp @ model.W_ + np.sqrt(0.7) * rng.normal(size=(200_000, 2))
    mc = np.mean(np.exp(-np.sum((z - zp) ** 2, 1) / (2 * 1.3)))
    assert model.predict_proba(x, xp)[0] == pytest.approx(mc, rel=0.01)


def test_em_increases_likelihood_monotonically_and_separates_pairs(rng):
    x, xp, similar = _pairs(rng)
    model = LatentCoincidenceAnalysis(rank=2, max_iter=200, tol=0.0).fit(x, xp, similar)
    history = model.log_likelihood_history_
    assert len(history) == 201
    assert np.all(np.diff(history) >= -1e-9 * np.abs(history[:-1]))
    assert history[-1] > history[0] + 50  # a real improvement, not a flat line
    assert model.log_likelihood(x, xp, similar) == pytest.approx(history[-1])
    # fresh pairs from the same classes: the learned metric ranks similar pairs closer
    x2, xp2, sim2 = _pairs(np.random.default_rng(99))
    p = model.predict_proba(x2, xp2)
    auc = np.mean(p[sim2][:, None] > p[~sim2][None, :])
    raw = np.sum((x2 - xp2) ** 2, 1)
    raw_auc = np.mean(raw[sim2][:, None] < raw[~sim2][None, :])
    assert auc > 0.75 and auc > raw_auc + 0.15, (auc, raw_auc)
    # the metric concentrates on the two informative input coordinates
    m = model.metric_
    assert np.trace(m[:2, :2]) > 10 * np.trace(m[2:, 2:])
    z = model.transform(x2)
    np.testing.assert_allclose(
        np.sum((z - model.transform(xp2)) ** 2, 1), np.einsum("nd,de,ne->n", x2 - xp2, m, x2 - xp2), rtol=1e-8
    )


def test_bad_input_is_named(rng):
    with pytest.raises(ValueError, match="both similar and dissimilar"):
        LatentCoincidenceAnalysis().fit(np.ones((3, 2)), np.zeros((3, 2)), [1, 1, 1])
    with pytest.raises(ValueError, match="equal shape"):
        LatentCoincidenceAnalysis().fit(np.ones((3, 2)), np.zeros((3, 3)), [1, 0, 1])
    with pytest.raises(ValueError, match="rank"):
        LatentCoincidenceAnalysis(rank=5).fit(np.ones((2, 2)), np.zeros((2, 2)), [1, 0])
