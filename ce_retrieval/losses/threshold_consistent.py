"""Threshold-Consistent Margin (TCM; Zhang et al., "Threshold-Consistent Margin Loss for Open-World Deep Metric
Learning", ICLR 2024, eq. 4; pytorch-metric-learning ``ThresholdConsistentMarginLoss``), a regulariser of the
cosine similarities S that makes one threshold fit every query.

It penalises only the pairs on the wrong side of two cosine margins, each side averaged over its violating pairs:

    L_TCM = λ⁺ · Σ_{P} (m⁺ - s_ij) 1[s_ij ≤ m⁺] / Σ_{P} 1[s_ij ≤ m⁺]
          + λ⁻ · Σ_{N} (s_ij - m⁻) 1[s_ij ≥ m⁻] / Σ_{N} 1[s_ij ≥ m⁻]

with P the positive pairs (R = 1), N the negatives (R = 0), ignored pairs (R = -1) in neither; a side with no
violating pair contributes 0. Defaults are the paper's: m⁺ = 0.9, m⁻ = 0.5, λ⁺ = λ⁻ = 1. The indicator counts are
constants of the gradient (as in pytorch-metric-learning): each violating pair gets ∓λ/count.

The margins are cosines, so S must be the cosine matrix, never logits λ·S: the retrieval objective adds a
configured regulariser ``weight · L_TCM`` to any loss on the cosine matrix, before its (learned or fixed) λ and b
(``loss.regularizers`` in the config; ``ce_retrieval/tasks/loss_wiring.py``; dense replicated path only: it
declares no tiled or sharded path, being a mean over the whole matrix). With a plain Keras model, add it to
the loss yourself on the cosines: ``loss(R, S) + w * functional.threshold_consistent_margin(R, S)``.

The sums over S equal those over Sᵀ, so ``bidirectional`` is not offered. Each term reads one entry
(``needs_gram`` is false). Functional core: :func:`threshold_consistent_margin`.
"""

from __future__ import annotations

import math
import numbers

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import masked_mean, pair_masks
from ce_retrieval.losses.registry import register


def _check(margin_plus, margin_minus, weight_plus, weight_minus, owner: str) -> tuple[float, float, float, float]:
    values = {
        "margin_plus": margin_plus,
        "margin_minus": margin_minus,
        "weight_plus": weight_plus,
        "weight_minus": weight_minus,
    }
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{owner}: {key} must be a finite number, got {value!r}")
    if not (-1.0 <= margin_minus <= 1.0 and -1.0 <= margin_plus <= 1.0):
        raise ValueError(f"{owner}: the margins are cosines in [-1, 1], got m+={margin_plus}, m-={margin_minus}")
    if weight_plus < 0 or weight_minus < 0:
        raise ValueError(f"{owner}: weight_plus and weight_minus must be >= 0, got {weight_plus}, {weight_minus}")
    return float(margin_plus), float(margin_minus), float(weight_plus), float(weight_minus)


def threshold_consistent_margin(
    relevance,
    scores,
    margin_plus: float = 0.9,
    margin_minus: float = 0.5,
    weight_plus: float = 1.0,
    weight_minus: float = 1.0,
):
    """TCM: ``λ⁺ mean_{P, s ≤ m⁺} (m⁺ - s) + λ⁻ mean_{N, s ≥ m⁻} (s - m⁻)`` on cosine ``scores``."""
    m_plus, m_minus, w_plus, w_minus = _check(
        margin_plus, margin_minus, weight_plus, weight_minus, "threshold_consistent_margin"
    )
    positive, negative = pair_masks(relevance)
    too_far = positive & (scores <= m_plus)  # positives below m⁺
    too_close = negative & (scores >= m_minus)  # negatives above m⁻
    return w_plus * masked_mean(m_plus - scores, too_far) + w_minus * masked_mean(scores - m_minus, too_close)


@register
class ThresholdConsistentMargin(RetrievalLoss):
    """TCM (Zhang et al. 2024) on cosine similarities; see module docstring.

    Args:
      margin_plus: m⁺, the cosine below which a positive pair is penalised (0.9).
      margin_minus: m⁻, the cosine above which a negative pair is penalised (0.5).
      weight_plus, weight_minus: λ⁺ and λ⁻ (1 and 1).
    """

    function = threshold_consistent_margin
    check = staticmethod(_check)
    supports_bidirectional = False  # the sums over S equal those over Sᵀ


__all__ = ["ThresholdConsistentMargin"]
