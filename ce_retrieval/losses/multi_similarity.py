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
"""
from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses import miners
from ce_retrieval.losses._pairs import masked_logsumexp, masked_mean, pair_masks, row_any
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.registry import register


@register
class MultiSimilarityLoss(RetrievalLoss):
    """Wang et al. (2019) with MS pair mining; see module docstring."""

    def __init__(
        self,
        alpha: float = 2.0,
        beta: float = 50.0,
        lambda_: float = 0.5,
        epsilon: float = 0.1,
        mining: bool = True,
        **kwargs,
    ):
        if alpha <= 0 or beta <= 0:
            raise ValueError(f"MultiSimilarityLoss: alpha and beta must be > 0, got {alpha}, {beta}")
        super().__init__(**kwargs)
        self.alpha, self.beta, self.lambda_ = float(alpha), float(beta), float(lambda_)
        self.epsilon, self.mining = float(epsilon), bool(mining)

    @tf.autograph.experimental.do_not_convert  # no tensor-dependent Python control flow: skip autograph
    def compute(self, relevance, scores):
        positive, negative = pair_masks(relevance)
        anchors = row_any(positive, keepdims=False)
        if self.mining:
            positive, negative = miners.multi_similarity_masks(relevance, scores, self.epsilon)
        pos_term = masked_logsumexp(-self.alpha * (scores - self.lambda_), positive, add_one=True) / self.alpha
        neg_term = masked_logsumexp(self.beta * (scores - self.lambda_), negative, add_one=True) / self.beta
        per_anchor = pos_term + neg_term
        if self.mining:
            valid = row_any(positive, keepdims=False) & row_any(negative, keepdims=False)
            per_anchor = tf.where(valid, per_anchor, tf.zeros_like(per_anchor))
        return masked_mean(per_anchor, anchors)

    def get_config(self):
        config = super().get_config()
        config.update(
            alpha=self.alpha, beta=self.beta, lambda_=self.lambda_, epsilon=self.epsilon, mining=self.mining
        )
        return config


__all__ = ["MultiSimilarityLoss"]
