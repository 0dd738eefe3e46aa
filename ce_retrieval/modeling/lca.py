"""Latent Coincidence Analysis (Der & Saul 2012; ProbML 16.2.1.3): a Mahalanobis metric fitted by EM.

Model for a pair ``(x, x')`` with label ``y ∈ {0, 1}`` (1 = similar):

    z ~ N(Wx, σ²I),   z' ~ N(Wx', σ²I),   p(y = 1 | z, z') = exp(−‖z − z'‖² / (2κ²)).

(the squared norm, as in Der & Saul; the ProbML text drops the square.)

Marginally ``z − z' ~ N(μ, 2σ²I)`` with ``μ = W(x − x')``, so with ``a = κ² + 2σ²``, ``ρ = κ²/a`` and
``L = rank``:

    p(y = 1 | x, x') = ρ^{L/2} exp(−‖μ‖² / (2a)),      ℓ = Σ_n log p(y_n | x_n, x'_n).

E step (closed form). Under ``y = 1`` the posterior means pull the pair together,
``E[z] = Wx − (1 − ρ)μ/2``, ``E[z'] = Wx' + (1 − ρ)μ/2``; under ``y = 0`` the posterior is the prior minus
the ``y = 1`` posterior (weights ``1/(1−p)`` and ``−p/(1−p)``), which pushes the pair apart:
``E[z] = Wx + r(1 − ρ)μ/2`` with ``r = p/(1 − p)``, symmetrically for ``z'``.

M step. ``W`` solves the least-squares problem ``min_W Σ_n ‖E z_n − W x_n‖² + ‖E z'_n − W x'_n‖²`` (the
posterior covariances do not depend on ``W``). ``κ²`` is then set by maximising ``ℓ`` itself over
``log κ²`` (a one-dimensional search, kept only if it improves ``ℓ``: an ECME step). Each iteration
therefore never decreases ``ℓ``, with no step size to tune.

``σ²`` is fixed (default 1): ``ℓ`` depends on ``(W, κ², σ²)`` only through ``W/√a`` and ``ρ``, and for
any fixed σ² the map ``(W, κ²) → (W/√a, ρ)`` is onto, so fixing σ² loses no generality.
Row convention: ``x`` is ``[N, D]``, the ``[D, rank]`` matrix ``W_`` maps ``z = x @ W_`` (that is, the
paper's ``W`` transposed); the learned metric is ``M = W_ W_ᵀ``.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar


class LatentCoincidenceAnalysis:
    """EM estimator of LCA. ``fit(x, x_prime, similar)`` then ``transform(x)`` / ``predict_proba(x, x')``.

    Args:
      rank: latent dimension ``L`` (defaults to the input dimension).
      sigma2: fixed latent noise variance σ² (see module docstring).
      max_iter, tol: stop after ``max_iter`` iterations or when ℓ improves by less than ``tol · |ℓ|``.
      init: ``'pca'`` (top principal directions of the pooled inputs, the Euclidean metric on them) or
        ``'identity'`` (``rank`` leading input coordinates).

    Attributes after ``fit``: ``W_`` ``[D, rank]``, ``kappa2_``, ``log_likelihood_history_`` (ℓ before the
    first and after every iteration), ``n_iter_``.
    """

    def __init__(
        self, rank: int | None = None, sigma2: float = 1.0, max_iter: int = 100, tol: float = 1e-6, init: str = "pca"
    ):
        if sigma2 <= 0:
            raise ValueError(f"LatentCoincidenceAnalysis: sigma2 must be > 0, got {sigma2}")
        if init not in ("pca", "identity"):
            raise ValueError(f"LatentCoincidenceAnalysis: init must be 'pca' or 'identity', got {init!r}")
        self.rank = rank
        self.sigma2 = float(sigma2)
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.init = init

    # -- model ---------------------------------------------------------------------------------------
    def _log_p_similar(self, diff_proj_sq: np.ndarray, kappa2: float) -> np.ndarray:
        a = kappa2 + 2.0 * self.sigma2
        return 0.5 * self._rank * np.log(kappa2 / a) - diff_proj_sq / (2.0 * a)

    def _log_likelihood(self, diff: np.ndarray, similar: np.ndarray, w: np.ndarray, kappa2: float) -> float:
        log_p = np.minimum(self._log_p_similar(np.sum((diff @ w) ** 2, axis=1), kappa2), -1e-300)
        return float(np.sum(np.where(similar, log_p, np.log(-np.expm1(log_p)))))

    def _best_kappa2(self, diff, similar, w, kappa2):
        objective = lambda t: -self._log_likelihood(diff, similar, w, float(np.exp(t)))
        t0 = np.log(kappa2)
        res = minimize_scalar(objective, bounds=(t0 - 8.0, t0 + 8.0), method="bounded", options={"xatol": 1e-8})
        return float(np.exp(res.x)) if res.fun < objective(t0) else kappa2

    # -- estimator -----------------------------------------------------------------------------------
    def fit(self, x, x_prime, similar) -> LatentCoincidenceAnalysis:
        x, x_prime, similar = self._check(x, x_prime, similar)
        dim = x.shape[1]
        self._rank = int(self.rank or dim)
        if not 1 <= self._rank <= dim:
            raise ValueError(f"LatentCoincidenceAnalysis: rank must lie in [1, {dim}], got {self.rank}")
        pooled = np.concatenate([x, x_prime])
        if self.init == "pca":
            centred = pooled - pooled.mean(axis=0)
            w = np.linalg.svd(centred, full_matrices=False)[2][: self._rank].T.copy()
        else:
            w = np.eye(dim, self._rank)
        diff = x - x_prime
        kappa2 = self._best_kappa2(diff, similar, w, float(np.median(np.sum((diff @ w) ** 2, axis=1)) + 1e-12))
        history = [self._log_likelihood(diff, similar, w, kappa2)]
        self.n_iter_ = 0
        for _ in range(self.max_iter):
            w = self._m_step_w(x, x_prime, similar, w, kappa2)
            kappa2 = self._best_kappa2(diff, similar, w, kappa2)
            history.append(self._log_likelihood(diff, similar, w, kappa2))
            self.n_iter_ += 1
            if history[-1] - history[-2] < self.tol * abs(history[-2]):
                break
        self.W_, self.kappa2_ = w, kappa2
        self.log_likelihood_history_ = np.asarray(history)
        return self

    def _m_step_w(self, x, x_prime, similar, w, kappa2):
        """E step (posterior means of z, z') followed by the weighted least-squares update of W."""
        mu = (x - x_prime) @ w  # [N, L]
        a = kappa2 + 2.0 * self.sigma2
        shrink = 1.0 - kappa2 / a  # 1 - ρ
        log_p = np.minimum(self._log_p_similar(np.sum(mu * mu, axis=1), kappa2), -1e-12)
        odds = np.exp(log_p) / -np.expm1(log_p)  # p / (1 - p)
        coef = np.where(similar, -shrink / 2.0, odds * shrink / 2.0)[:, None]
        ez = x @ w + coef * mu
        ez_prime = x_prime @ w - coef * mu
        inputs = np.concatenate([x, x_prime])
        targets = np.concatenate([ez, ez_prime])
        return np.linalg.lstsq(inputs, targets, rcond=None)[0]

    def log_likelihood(self, x, x_prime, similar) -> float:
        """ℓ of labelled pairs under the fitted model."""
        x, x_prime, similar = self._check(x, x_prime, similar)
        return self._log_likelihood(x - x_prime, similar, self.W_, self.kappa2_)

    def predict_proba(self, x, x_prime) -> np.ndarray:
        """``p(y = 1 | x, x')`` for paired rows."""
        diff = np.asarray(x, np.float64) - np.asarray(x_prime, np.float64)
        return np.exp(self._log_p_similar(np.sum((diff @ self.W_) ** 2, axis=1), self.kappa2_))

    def transform(self, x) -> np.ndarray:
        """``z = x W_``: Euclidean distance between transformed points is the learned ``d_M``."""
        return np.asarray(x, np.float64) @ self.W_

    @property
    def metric_(self) -> np.ndarray:
        return self.W_ @ self.W_.T

    @staticmethod
    def _check(x, x_prime, similar):
        x = np.asarray(x, np.float64)
        x_prime = np.asarray(x_prime, np.float64)
        similar = np.asarray(similar).astype(bool)
        if x.ndim != 2 or x.shape != x_prime.shape or similar.shape != (len(x),):
            raise ValueError(
                "LatentCoincidenceAnalysis: need x and x_prime of equal shape [N, D] and similar [N], got "
                f"{x.shape}, {x_prime.shape}, {similar.shape}"
            )
        if not (similar.any() and (~similar).any()):
            raise ValueError("LatentCoincidenceAnalysis: need both similar and dissimilar pairs")
        return x, x_prime, similar


__all__ = ["LatentCoincidenceAnalysis"]
