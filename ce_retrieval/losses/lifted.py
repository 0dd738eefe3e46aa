"""Lifted structured loss (Oh Song, Xiang, Jegelka & Savarese 2016, "Deep metric learning via lifted
structured feature embedding"), the smooth form of their eq. (4).

With Euclidean distances ``D = sqrt(2 - 2s)`` on the unit sphere and margin ``alpha`` (paper: 1.0), every
positive pair (i, j) is contrasted with *all* negatives of both its ends:

    J_ij = log( sum_{k in Neg(i)} exp(alpha - D_ik) + sum_{l in Neg(j)} exp(alpha - D_jl) ) + D_ij
    L    = 1 / (2 |P|) * sum_{(i,j) in P} [J_ij]_+^2

On a rectangular ``S`` (queries x documents) ``Neg(i)`` is row i (documents irrelevant to query i) and
``Neg(j)`` is column j (queries irrelevant to document j); for single-modality ``S = E E^T`` column j is
row j, which is the paper's definition. Reduction: the paper's, ``1/(2|P|)``, i.e. half the mean over
positive pairs; with ``S = E E^T`` each unordered pair appears twice with the same ``J``, so the mean over
ordered pairs equals the paper's mean over unordered ones. This matches pytorch-metric-learning's
``LiftedStructureLoss(neg_margin=alpha, pos_margin=0)`` with a ``MeanReducer`` (its default reducer
averages over non-zero terms only). Cost: O(N M) (row and column log-sum-exps).

Gram matrix (``needs_gram`` is false). The paper's ``D_jl`` terms are the distances of the positive ``j`` to its
own negatives; on a rectangular or two-tower ``S`` they are read from column ``j`` (the queries irrelevant to
document ``j``), never from a row ``S[j, :]``, so a text × image matrix holds every term the loss reads
(image ``j`` against the texts that do not describe it), and ``S = E Eᵀ`` gives the paper's single-modality
definition. Functional core: :func:`lifted_structure`.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses._similarity import distance
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import logaddexp, masked_logsumexp, masked_mean, pair_masks
from ce_retrieval.losses.registry import register


def _check(margin, owner: str) -> tuple[float]:
    return (float(margin),)


def lifted_structure(relevance, scores, margin: float = 1.0):
    """``1/(2|P|) sum_{(i,j) in P} [log(sum_{Neg(i)} e^{a-D_ik} + sum_{Neg(j)} e^{a-D_lj}) + D_ij]_+^2``."""
    positive, negative = pair_masks(relevance)
    dist = distance(scores, "euclidean")
    logits = float(margin) - dist
    row = masked_logsumexp(logits, negative, axis=1)[:, None]  # query i's negatives
    col = masked_logsumexp(logits, negative, axis=0)[None, :]  # document j's negatives
    j = logaddexp(row, col) + dist
    return 0.5 * masked_mean(tf.square(tf.nn.relu(j)), positive)


@register
class LiftedStructureLoss(RetrievalLoss):
    """Oh Song et al. (2016): ``1/(2|P|) sum [log(sum e^{a-D_ik} + sum e^{a-D_jl}) + D_ij]_+^2``."""

    function = lifted_structure
    check = staticmethod(_check)


__all__ = ["LiftedStructureLoss"]
