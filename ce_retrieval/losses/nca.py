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

Logit scale. On cosine ``S``, ``exp(−scale·d²) = exp(2·scale·s − 2·scale)`` and the constant cancels in
``p_ij``: NCA is a softmax over ``λ·S`` with ``λ = 2·scale`` (``NCALoss.logit_scale_kwargs(λ)`` gives
``scale = λ/2``), so with one positive per row ``NCALoss(scale=λ/2)`` equals the softmax cross-entropy over
``λ·S`` (all valid documents in the denominator). Only on cosines, though: ``d²`` is clamped at 0 (against
rounding), which is not linear in S (``2 − 2λs`` would clamp wherever ``λs > 1``), so NCA declares ``needs_cosine``
and a learned λ given at call (``logit_scale=``) is used as ``scale = λ/2``, not folded into S, which stays cosines.

Only row ``i`` of ``S`` is read (``needs_gram`` is false): the documents may be another modality.
Functional core: :func:`nca` (``ce_retrieval.losses.functional.nca``).
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses._similarity import check_similarity, squared_distance
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import masked_logsumexp, masked_mean, row_any
from ce_retrieval.losses.registry import register
from ce_retrieval.losses.relevance import IRRELEVANT, RELEVANT

OBJECTIVES = ("log", "expected")


def nca_per_query(
    relevance,
    scores,
    scale: float,
    similarity: str = "cosine",
    objective: str = "log",
    include_positives_in_denominator: bool = True,
):
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


def check_nca(scale, similarity, objective, owner: str) -> tuple[float | tf.Tensor, str, str]:
    """Validated ``(scale, similarity, objective)`` (a tensor ``scale``, a learned λ/2, as float32); ``ValueError``
    naming ``owner`` otherwise."""
    if tf.is_tensor(scale):
        scale = tf.cast(scale, tf.float32)
    elif not scale > 0:
        raise ValueError(f"{owner}: scale must be > 0, got {scale}")
    if objective not in OBJECTIVES:
        raise ValueError(f"{owner}: objective must be 'log' or 'expected', got {objective!r}")
    return scale if tf.is_tensor(scale) else float(scale), check_similarity(similarity, owner), objective


def nca(
    relevance,
    scores,
    scale: float = 1.0,
    similarity: str = "cosine",
    objective: str = "log",
    include_positives_in_denominator: bool = True,
):
    """NCA (module docstring): mean over queries with a positive of ``−log p_i`` (or ``1 − p_i``)."""
    scale, similarity, objective = check_nca(scale, similarity, objective, "nca")
    per_query, valid = nca_per_query(
        relevance, scores, scale, similarity, objective, bool(include_positives_in_denominator)
    )
    return masked_mean(per_query, valid)


@register
class NCALoss(RetrievalLoss):
    """Soft nearest-neighbour classification loss; equation and conventions in the module docstring.

    Args:
      scale: inverse temperature on squared distances (default 1, Goldberger); the logit scale is λ = 2·scale.
      similarity: ``'cosine'`` or ``'negative_squared_distance'`` (how ``S`` maps to ``d²``).
      objective: ``'log'`` (−log p_i) or ``'expected'`` (1 − p_i).
    """

    function = nca
    # On cosine S, d² = 2 − 2s, so exp(−scale·d²) = exp(2·scale·s − 2·scale): the logit scale λ of the softmax
    # family is 2·scale (λ = 20 is scale = 10), which is what the two methods below translate.
    has_logit_scale = True
    needs_cosine = True  # d² = max(2 − 2s, 0) is not linear in S: a learned λ comes apart, S stays cosines

    @classmethod
    def logit_scale_kwargs(cls, scale) -> dict:
        return {"scale": (scale if tf.is_tensor(scale) else float(scale)) / 2.0}

    @property
    def logit_scale(self) -> float:
        return 2.0 * self.scale if self.similarity == "cosine" else self.scale

    def __init__(self, scale: float = 1.0, similarity: str = "cosine", objective: str = "log", **kwargs):
        super().__init__(**kwargs)
        self.scale, self.similarity, self.objective = check_nca(scale, similarity, objective, type(self).__name__)


__all__ = ["NCALoss"]
