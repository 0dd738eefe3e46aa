"""Multi-similarity loss (Wang, Han, Huang, Dong & Scott 2019, "Multi-similarity loss with general pair
weighting for deep metric learning"), with its own pair mining.

Mining (epsilon = 0.1, ``miners.multi_similarity_masks``): for anchor i keep negatives with
``S_ik + eps > min_{y_j = y_i} S_ij`` and positives with ``S_ij - eps < max_{y_k != y_i} S_ik``. Then

    L_i = 1/alpha log(1 + sum_{k in P_i} exp(-alpha (S_ik - lambda)))
        + 1/beta  log(1 + sum_{k in N_i} exp( beta (S_ik - lambda)))

alpha = 2, beta = 50 (paper). lambda: the paper states 1; its reference code, pytorch-metric-learning
(``base``) and TF-Similarity (``lmda``) use 0.5 for cosine similarities, the default here.
Reduction: the paper's ``1/m sum_i``, the mean over anchors (rows with at least one positive); as in the
reference code and TF-Similarity, an anchor whose mined positive or negative set is empty contributes 0.
With ``mining=False`` every pair is used (pytorch-metric-learning's ``MultiSimilarityLoss`` without a miner).

Anchor ``i``'s pairs and its mining are all in row ``i`` (``needs_gram`` is false). Functional core:
:func:`multi_similarity`.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses import miners
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import masked_logsumexp, masked_mean, pair_masks, row_any
from ce_retrieval.losses.registry import register


def _check(alpha, beta, lambda_, epsilon, mining, owner: str):
    if alpha <= 0 or beta <= 0:
        raise ValueError(f"{owner}: alpha and beta must be > 0, got {alpha}, {beta}")
    return float(alpha), float(beta), float(lambda_), float(epsilon), bool(mining)


def multi_similarity(
    relevance,
    scores,
    alpha: float = 2.0,
    beta: float = 50.0,
    lambda_: float = 0.5,
    epsilon: float = 0.1,
    mining: bool = True,
):
    """Wang et al. (2019) with MS pair mining (``mining=False``: every pair), mean over anchors."""
    alpha, beta, lambda_, epsilon, mining = _check(alpha, beta, lambda_, epsilon, mining, "multi_similarity")
    positive, negative = pair_masks(relevance)
    anchors = row_any(positive, keepdims=False)
    if mining:
        positive, negative = miners.multi_similarity_masks(relevance, scores, epsilon)
    pos_term = masked_logsumexp(-alpha * (scores - lambda_), positive, add_one=True) / alpha
    neg_term = masked_logsumexp(beta * (scores - lambda_), negative, add_one=True) / beta
    per_anchor = pos_term + neg_term
    if mining:
        valid = row_any(positive, keepdims=False) & row_any(negative, keepdims=False)
        per_anchor = tf.where(valid, per_anchor, tf.zeros_like(per_anchor))
    return masked_mean(per_anchor, anchors)


@register
class MultiSimilarityLoss(RetrievalLoss):
    """Wang et al. (2019) with MS pair mining; see module docstring."""

    function = multi_similarity
    check = staticmethod(_check)


__all__ = ["MultiSimilarityLoss"]
