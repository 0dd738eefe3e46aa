"""Contrastive loss (Hadsell, Chopra & LeCun 2006, "Dimensionality reduction by learning an invariant mapping").

With ``d = ||x_i - x_j||`` the Euclidean distance of the two L2-normalised embeddings (on the unit sphere
``d^2 = 2 - 2 s_ij``) and ``m`` the margin *on the distance*, every labelled pair costs

    positive (y = 1):   1/2 d^2
    negative (y = 0):   1/2 [m - d]_+^2

Reduction. Hadsell et al. sum the per-pair terms over all labelled pairs; the loss is their mean over all
non-ignored pairs (``balanced=False``, default). With P x K batches negatives outnumber positives by
about ``(P - 1) K / (K - 1)``; ``balanced=True`` instead returns mean(positive terms) + mean(negative terms)
(the per-part reduction of pytorch-metric-learning's ``ContrastiveLoss``). Default margin 1.0 (``s = 0.5``).
pytorch-metric-learning's ``ContrastiveLoss`` uses un-squared hinges ``[d - m_pos]_+ + [m_neg - d]_+``, so
its values differ from the paper's; tests compare against a NumPy transcription of the equation above.

Each term reads one entry ``s_ij`` (``needs_gram`` is false). Functional core: :func:`contrastive`.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses._similarity import distance, squared_distance
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import masked_mean, pair_masks
from ce_retrieval.losses.registry import register


def _check(margin, balanced, owner: str) -> tuple[float, bool]:
    if not margin > 0:
        raise ValueError(f"{owner}: margin must be > 0, got {margin}")
    return float(margin), bool(balanced)


def contrastive(relevance, scores, margin: float = 1.0, balanced: bool = False):
    """Hadsell et al. (2006): ``1/2 d^2`` for positives, ``1/2 [m - d]_+^2`` for negatives (module docstring)."""
    margin, balanced = _check(margin, balanced, "contrastive")
    positive, negative = pair_masks(relevance)
    pull = 0.5 * squared_distance(scores)
    push = 0.5 * tf.square(tf.nn.relu(margin - distance(scores, "euclidean")))
    if balanced:
        return masked_mean(pull, positive) + masked_mean(push, negative)
    per_pair = tf.where(positive, pull, push)
    return masked_mean(per_pair, positive | negative)


@register
class ContrastiveLoss(RetrievalLoss):
    """Hadsell et al. (2006): ``1/2 d^2`` for positives, ``1/2 [m - d]_+^2`` for negatives (see module doc)."""

    function = contrastive
    check = staticmethod(_check)


__all__ = ["ContrastiveLoss"]
