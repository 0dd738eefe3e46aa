"""Neighbourhood Component Analysis (Goldberger et al. 2004; ProbML 16.2.1.2) on in-batch examples.

Each query ``i`` picks a neighbour ``j`` among the valid documents of its row (relevance 0 or 1; ``-1``,
e.g. the diagonal of ``E Eᵀ``, is excluded) with the soft nearest-neighbour probability

    p_ij = exp(−scale · d²_ij) / Σ_{l valid} exp(−scale · d²_il)

and is correctly classified with probability ``p_i = Σ_{j ∈ P_i} p_ij`` (``P_i``: positives of row i).

* ``objective='log'`` (default; Goldberger's log-likelihood form, as pytorch-metric-learning):
  ``L = mean_i −log p_i``;
* ``objective='expected'`` (ProbML's leave-one-out error ``1 − J(W)/N``): ``L = mean_i (1 − p_i)``.

The mean runs over queries with at least one positive: NCA scores a query, not a pair, so this is the one
loss of the family with one term per query rather than per positive pair. ``d²`` comes from ``S`` as
``similarity`` says (``2 − 2S`` for cosine, ``−S`` for a learned Mahalanobis metric); ``scale = 1`` is
Goldberger's ``exp(−‖Wx_i − Wx_j‖²)`` and equals pytorch-metric-learning's ``softmax_scale``.
"""
from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses._metric import check_similarity, squared_distance
from ce_retrieval.losses._pairs import masked_logsumexp, masked_mean, row_any
from ce_retrieval.losses.base import IRRELEVANT, RELEVANT, RetrievalLoss
from ce_retrieval.losses.registry import register


def nca_per_query(relevance, scores, scale: float, similarity: str = "cosine", objective: str = "log",
                  include_positives_in_denominator: bool = True):
    """Per-query NCA terms ``[N]`` and the mask of queries that have a positive."""
    logits = -scale * squared_distance(scores, similarity)
    positive = relevance == RELEVANT
    valid = positive | (relevance == IRRELEVANT)
    denominator_mask = valid if include_positives_in_denominator else (relevance == IRRELEVANT)
    present = row_any(positive, keepdims=False) & row_any(denominator_mask, keepdims=False)
    # empty sets give NEG in masked_logsumexp: replace the difference so exp() below stays finite
    log_p = tf.where(present, masked_logsumexp(logits, positive) - masked_logsumexp(logits, denominator_mask), 0.0)
    per_query = -log_p if objective == "log" else 1.0 - tf.exp(log_p)
    return per_query, present


@register
class NCALoss(RetrievalLoss):
    """Soft nearest-neighbour classification loss; equation and conventions in the module docstring.

    Args:
      scale: inverse temperature on squared distances (default 1, Goldberger).
      similarity: ``'cosine'`` or ``'negative_squared_distance'`` (how ``S`` maps to ``d²``).
      objective: ``'log'`` (−log p_i) or ``'expected'`` (1 − p_i).
    """

    _default_name = "nca_loss"

    def __init__(self, scale: float = 1.0, similarity: str = "cosine", objective: str = "log", **kwargs):
        kwargs.setdefault("name", self._default_name)
        super().__init__(**kwargs)
        if scale <= 0:
            raise ValueError(f"{type(self).__name__}: scale must be > 0, got {scale}")
        if objective not in ("log", "expected"):
            raise ValueError(f"{type(self).__name__}: objective must be 'log' or 'expected', got {objective!r}")
        self.scale = float(scale)
        self.similarity = check_similarity(similarity, type(self).__name__)
        self.objective = objective

    def _include_positives(self) -> bool:
        return True

    def compute(self, relevance, scores):
        per_query, valid = nca_per_query(
            relevance, scores, self.scale, self.similarity, self.objective, self._include_positives()
        )
        return masked_mean(per_query, valid)

    def get_config(self):
        return {**super().get_config(), "scale": self.scale, "similarity": self.similarity,
                "objective": self.objective}


__all__ = ["NCALoss", "nca_per_query"]
