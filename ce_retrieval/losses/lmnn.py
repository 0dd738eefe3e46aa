"""Large Margin Nearest Neighbours (Weinberger & Saul 2009; ProbML 16.2.1.1) on a batch.

For each query ``i`` with target neighbours ``T_i`` (same-label points that should be its nearest
neighbours) and impostor candidates ``Neg_i`` (different label), on squared distances ``d²``:

    L = 1/|T| Σ_{(i,j) ∈ T} [ (1 − λ) d²_ij + λ Σ_{l ∈ Neg_i} [m + d²_ij − d²_il]_+ ]

i.e. ProbML's ``(1 − λ) L_pull + λ L_push`` divided by the number of target pairs (a constant), so one
term per (query, target) pair, the mean-over-positive-pairs contract. The margin ``m`` (default 1, as in
the paper) is on **squared** distances; ``λ = 0.5`` (the paper's μ).

Target neighbours. LMNN fixes them before training (the ``k`` nearest same-label points in the input
space). Both ways are available:

* ``k=None``: every positive (relevance 1) is a target. Give fixed targets by passing a relevance matrix
  with 1 on target pairs, 0 on impostor candidates and -1 on the other same-label pairs
  (:func:`lmnn_target_relevance` builds it from input features and labels);
* ``k=3`` (default): the ``k`` nearest positives of each row under the current metric (selection without
  gradient), the usual in-batch adaptation; rows with fewer positives use all they have.

Cost: ``O(N · k · M)`` memory for the hinge tensor; ``k=None`` costs ``O(N · |P_i| · M)``.
``d²`` from ``S``: ``2 − 2S`` (``similarity='cosine'``) or ``−S`` (``'negative_squared_distance'``, for a
learned Mahalanobis metric, :mod:`ce_retrieval.modeling.mahalanobis`).

Only row ``i`` is read: targets ``j`` and impostors ``l`` are both documents of query ``i`` (``d²_ij``,
``d²_il``), never a row of a target, so ``S`` need not be a Gram matrix (``needs_gram`` is false; LMNN is
usually run on ``S = E Eᵀ`` with the diagonal ignored). Functional core: :func:`lmnn`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ce_retrieval.losses._similarity import check_similarity, squared_distance
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.registry import register
from ce_retrieval.losses.relevance import IRRELEVANT, RELEVANT


def lmnn_target_relevance(features, labels, k: int = 3) -> np.ndarray:
    """``[N, N]`` relevance for :class:`LMNNLoss` with ``k=None``: 1 for the ``k`` nearest same-label points
    in Euclidean input space (the paper's fixed target neighbours), 0 for other labels, -1 elsewhere."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels)
    if x.ndim != 2 or y.shape != (len(x),):
        raise ValueError(f"lmnn_target_relevance: need features [N, D] and labels [N], got {x.shape}, {y.shape}")
    sq = np.sum(x * x, axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * x @ x.T
    same = y[:, None] == y[None, :]
    np.fill_diagonal(same, False)
    d2 = np.where(same, d2, np.inf)
    order = np.argsort(d2, axis=1, kind="stable")[:, :k]
    rel = np.where(y[:, None] == y[None, :], -1.0, 0.0).astype(np.float32)
    rows = np.repeat(np.arange(len(x)), order.shape[1])
    chosen = np.isfinite(d2[rows, order.ravel()])
    rel[rows[chosen], order.ravel()[chosen]] = 1.0
    return rel


def check_lmnn(k, margin, push_weight, similarity, owner: str):
    if k is not None and int(k) < 1:
        raise ValueError(f"{owner}: k must be >= 1 or None, got {k}")
    if not 0.0 <= push_weight <= 1.0:
        raise ValueError(f"{owner}: push_weight (λ) must lie in [0, 1], got {push_weight}")
    return None if k is None else int(k), float(margin), float(push_weight), check_similarity(similarity, owner)


def lmnn(
    relevance, scores, k: int | None = 3, margin: float = 1.0, push_weight: float = 0.5, similarity: str = "cosine"
):
    """LMNN's ``(1 − λ) pull + λ push`` per (query, target) pair, averaged over target pairs (module docstring)."""
    k, margin, push_weight, similarity = check_lmnn(k, margin, push_weight, similarity, "lmnn")
    d2 = squared_distance(scores, similarity)  # [N, M]
    positive = relevance == RELEVANT
    negative = tf.cast(relevance == IRRELEVANT, tf.float32)
    if k is None:
        target_d2 = d2[:, :, None]  # [N, M, 1]: every column, masked to positives below
        target = tf.cast(positive, tf.float32)
    else:
        k = tf.minimum(k, tf.shape(d2)[1])
        closeness = tf.where(positive, -tf.stop_gradient(d2), -np.inf)
        _, idx = tf.math.top_k(closeness, k=k)  # [N, k] nearest positives
        target = tf.cast(tf.gather(positive, idx, batch_dims=1), tf.float32)
        target_d2 = tf.gather(d2, idx, batch_dims=1)[:, :, None]
    hinge = tf.nn.relu(margin + target_d2 - d2[:, None, :]) * negative[:, None, :]  # [N, T, M]
    per_target = (1.0 - push_weight) * target_d2[:, :, 0] + push_weight * tf.reduce_sum(hinge, -1)
    return tf.reduce_sum(per_target * target) / tf.maximum(tf.reduce_sum(target), 1.0)


@register
class LMNNLoss(RetrievalLoss):
    """LMNN pull/push objective; see the module docstring for the equation and target selection."""

    function = lmnn
    check = staticmethod(check_lmnn)


__all__ = ["LMNNLoss", "lmnn_target_relevance"]
