"""Binomial deviance loss (Yi, Lei, Liao & Li 2014, "Deep metric learning for person re-identification").

With cosine similarities S, M_ij = 1 for positive pairs and -C for negative pairs, and W_ij = 1/|P| on
positives, 1/|N| on negatives (each half of the batch weighs the same):

    L = sum_ij W_ij log(1 + exp(-alpha (S_ij - beta) M_ij))
      = mean_{P} softplus(-alpha (s - beta)) + mean_{N} softplus(alpha C (s - beta))

Defaults alpha = 2, beta = 0.5, C = 25 (the values used for this loss in Ustinova & Lempitsky 2016's
comparison, citing Yi et al.). The reduction is the paper's W (a batch-level mean of each part), not a
mean over positive pairs only. No pytorch-metric-learning / TF-Similarity counterpart; tests use NumPy.

Each term reads one entry ``s_ij`` (``needs_gram`` is false). Functional core: :func:`binomial_deviance`.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import masked_mean, pair_masks
from ce_retrieval.losses.registry import register


def _check(alpha, beta, negative_cost, owner: str):
    if alpha <= 0 or negative_cost <= 0:
        raise ValueError(f"{owner}: alpha and negative_cost must be > 0, got {alpha}, {negative_cost}")
    return float(alpha), float(beta), float(negative_cost)


def binomial_deviance(relevance, scores, alpha: float = 2.0, beta: float = 0.5, negative_cost: float = 25.0):
    """Yi et al. (2014): ``mean_P softplus(-a(s-b)) + mean_N softplus(a C (s-b))``."""
    alpha, beta, negative_cost = _check(alpha, beta, negative_cost, "binomial_deviance")
    positive, negative = pair_masks(relevance)
    shifted = alpha * (scores - beta)
    return masked_mean(tf.nn.softplus(-shifted), positive) + masked_mean(
        tf.nn.softplus(negative_cost * shifted), negative
    )


@register
class BinomialDevianceLoss(RetrievalLoss):
    """Yi et al. (2014): ``mean_P softplus(-a(s-b)) + mean_N softplus(a C (s-b))``; see module docstring."""

    function = binomial_deviance
    check = staticmethod(_check)


__all__ = ["BinomialDevianceLoss"]
