"""Proper scores of predicted probabilities p against 0/1 outcomes y, streamed: Brier score, log loss, and Murphy's
decomposition of the Brier score into reliability, resolution and uncertainty.

    Brier    = (1/n) sum_i (p_i - y_i)^2
    log loss = -(1/n) sum_i [y_i log p_i + (1 - y_i) log(1 - p_i)],   p_i clipped to [1e-7, 1 - 1e-7]

(the clip bounds one pair's log loss at -log(1e-7) = 16.1: an isotonic map predicts exactly 0 below its lowest
positive and 1 above its highest negative, and one relevant pair there would make the mean infinite). Both are
proper: their expectation is lowest when p is the true probability, so unlike the ECE they reward separating
relevant from irrelevant pairs as well as stating the rate honestly. Murphy (1973), with the pairs grouped in bins b
of predicted probability (n_b pairs, mean prediction pbar_b, observed share obar_b; obar over all pairs):

    Brier = REL - RES + UNC + WBV - 2 WBC
    REL = (1/n) sum_b n_b (pbar_b - obar_b)^2        reliability: calibration error (lower is better)
    RES = (1/n) sum_b n_b (obar_b - obar)^2          resolution: how far the bins' outcomes move from the base rate
    UNC = obar (1 - obar)                            uncertainty: the Brier score of always predicting obar
    WBV = (1/n) sum_b sum_{i in b} (p_i - pbar_b)^2, WBC = (1/n) sum_b sum_{i in b} (p_i - pbar_b)(y_i - obar_b)

(WBV, WBC: the within-bin terms of Stephenson et al. 2008; zero when each bin holds one predicted value, which makes
the identity the textbook REL - RES + UNC). Bins: ``num_bins`` equal-width bins of p over [0, 1], default 1,000 (bin
= min(floor(1000 p), 999)). The isotonic map is flat on its fitted steps but linear between their knots, so its
outputs are not a finite set to bin by; 0.001-wide bins leave WBV below 0.001^2 / 4 per pair, and both within-bin
terms are reported so the identity holds exactly.

What separates two maps on retrieval pairs: with one relevant image in 500, UNC ~ 0.002 is most of any map's Brier
score and no model changes it, so the raw Brier score and log loss differ between models only in a late decimal.
The model's part is RES - REL, and the *skill* against the base rate makes it readable:

    Brier skill    = 1 - Brier / UNC               (~ (RES - REL) / UNC: the share of the outcome variance explained)
    log-loss skill = 1 - log loss / H(obar)        (the share of the base rate's entropy removed),
    H(o) = -[o log o + (1 - o) log(1 - o)]         (the log loss of always predicting o)

0 for a map that only knows the base rate, 1 for a perfect one. A proper score restricted to the pairs a map itself
predicts >= 0.1 is not proper any more (each map picks its own pairs; one that never says 0.1 scores on nothing), so
the confident region is described by the count and observed precision of such pairs instead (``probability``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DEFAULT_SCORE_BINS", "LOG_LOSS_CLIP", "ProperScores", "proper_scores"]

DEFAULT_SCORE_BINS = 1000
LOG_LOSS_CLIP = 1e-7
# the result's figures besides the counts (None when there are no pairs)
_FIGURES = (
    "base_rate",
    "brier",
    "log_loss",
    "brier_skill",
    "log_loss_skill",
    "reliability",
    "resolution",
    "uncertainty",
    "within_bin_variance",
    "within_bin_covariance",
)


class ProperScores:
    """Running sums for the Brier score, log loss and its decomposition: ``add`` blocks of (p, y), then ``result()``.
    Per bin: pairs, sum p, sum p^2, sum y, sum p y; and the summed log loss."""

    def __init__(self, num_bins: int = DEFAULT_SCORE_BINS):
        if int(num_bins) < 1:
            raise ValueError(f"num_bins must be positive, got {num_bins}")
        self.num_bins = int(num_bins)
        self._sums = np.zeros((5, self.num_bins))
        self._log_loss = 0.0

    def add(self, p, y) -> None:
        p = np.asarray(p, np.float64).reshape(-1)
        y = np.asarray(y).reshape(-1).astype(bool)
        if p.shape != y.shape:
            raise ValueError(f"p and y must match: {p.shape} vs {y.shape}")
        if not np.all((p >= 0.0) & (p <= 1.0)):
            raise ValueError("p must be probabilities in [0, 1]")
        b = np.clip((p * self.num_bins).astype(np.int64), 0, self.num_bins - 1)
        yp = np.where(y, p, 0.0)
        for k, w in enumerate((None, p, p * p, y, yp)):
            self._sums[k] += np.bincount(b, w, minlength=self.num_bins)
        c = np.clip(p, LOG_LOSS_CLIP, 1.0 - LOG_LOSS_CLIP)
        self._log_loss -= float(np.log(c[y]).sum() + np.log1p(-c[~y]).sum())

    def result(self) -> dict:
        """``brier``, ``log_loss``, their skills, ``reliability``, ``resolution``, ``uncertainty``,
        ``within_bin_variance``, ``within_bin_covariance``, ``base_rate``, ``num_pairs``, ``num_bins`` (None where
        there are no pairs; skills None when every outcome is equal)."""
        count, sp, sp2, sy, spy = self._sums
        n = count.sum()
        out = {"num_pairs": int(n), "num_bins": self.num_bins}
        if n == 0:
            return out | dict.fromkeys(_FIGURES)
        o = sy.sum() / n
        safe = np.maximum(count, 1)
        pbar, obar = sp / safe, sy / safe
        brier = (sp2.sum() - 2.0 * spy.sum() + sy.sum()) / n  # y^2 = y
        log_loss = self._log_loss / n
        unc = o * (1.0 - o)
        entropy = -(o * np.log(o) + (1.0 - o) * np.log1p(-o)) if 0.0 < o < 1.0 else 0.0
        return out | {
            "base_rate": float(o),
            "brier": float(brier),
            "log_loss": float(log_loss),
            "brier_skill": float(1.0 - brier / unc) if unc > 0 else None,
            "log_loss_skill": float(1.0 - log_loss / entropy) if entropy > 0 else None,
            "reliability": float(np.sum(count * (pbar - obar) ** 2) / n),
            "resolution": float(np.sum(count * (obar - o) ** 2) / n),
            "uncertainty": float(unc),
            "within_bin_variance": float(np.sum(sp2 - count * pbar**2) / n),
            "within_bin_covariance": float(np.sum(spy - count * pbar * obar) / n),
        }


def proper_scores(p, y, num_bins: int = DEFAULT_SCORE_BINS) -> dict:
    """:class:`ProperScores` of one set of predictions ``p`` and 0/1 outcomes ``y``."""
    scores = ProperScores(num_bins)
    scores.add(p, y)
    return scores.result()
