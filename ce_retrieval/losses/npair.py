"""Multi-class N-pair loss (Sohn 2016) and InfoNCE / CLIP's symmetric InfoNCE (van den Oord et al. 2018;
Radford et al. 2021). They are one equation: for a positive pair (i, j) with logits ``l = scale * S``,

    l_ij = log(1 + sum_{k in Neg(i)} exp(l_ik - l_ij)) = -log( e^{l_ij} / (e^{l_ij} + sum_{k in Neg(i)} e^{l_ik}) )

averaged over positive pairs (with one positive per row this is the paper's ``1/N sum_i``). Other positives
of the row are left out of the denominator (each positive pair is its own classification problem, as in
pytorch-metric-learning's ``NTXentLoss``); ignored pairs (-1) are left out everywhere. With one positive
per row and nothing ignored it is exactly the cross-entropy of CLIP.

* ``NPairLoss(scale=1.0)``: Sohn's form on raw inner products ``f^T f+`` (scale 1). Sohn also adds an L2
  penalty on the un-normalised embeddings (lambda = 0.002); that needs the embeddings, not ``S``: add
  ``activity_regularizer=tf_keras.regularizers.L2(0.002)`` to the embedding layer.
* ``InfoNCE(temperature=0.07)``: logits ``S / temperature`` (CLIP's initial temperature). ``NPairLoss(scale=s)``
  equals ``InfoNCE(temperature=1/s)``.
* ``SymmetricInfoNCE``: CLIP's loss, the mean of the text->image loss on ``S`` and image->text on ``S^T``
  (``InfoNCE(bidirectional=True)``). A learned temperature belongs to the model (multiply S by its
  ``logit_scale`` and pass ``temperature=1``).

Functional core (``ce_retrieval.losses.functional``): :func:`npair`, :func:`info_nce`, :func:`symmetric_info_nce`.
The per-row form reads row ``i`` of ``S`` only (``needs_gram`` is false): a two-tower text × image matrix is
exactly its use.
"""

from __future__ import annotations

import numbers

import tensorflow as tf

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import masked_logsumexp, masked_mean, pair_masks
from ce_retrieval.losses.registry import register


def softmax_per_positive(relevance: tf.Tensor, logits: tf.Tensor, axis: int = 1) -> tf.Tensor:
    """Mean over positive pairs of ``-log(e^{l_ij} / (e^{l_ij} + sum_{Neg(i)} e^{l_ik}))``; ``axis=0`` contrasts
    each positive with the negatives of its column instead (the image->text direction, without a transpose)."""
    positive, negative = pair_masks(relevance)
    negatives = tf.expand_dims(masked_logsumexp(logits, negative, axis=axis), axis)
    # log(e^l + e^neg) - l = softplus(neg - l): one stable elementwise pass (a row without negatives has
    # neg = NEG, giving 0)
    return masked_mean(tf.nn.softplus(negatives - logits), positive)


def _positive(value, what: str, owner: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{owner}: {what} must be > 0, got {value}")
    return float(value)


def npair(relevance, scores, scale: float = 1.0):
    """Sohn (2016): mean over positive pairs of ``log(1 + sum_{k in Neg(i)} exp(scale * (s_ik - s_ij)))``."""
    return softmax_per_positive(relevance, _positive(scale, "scale", "NPairLoss") * scores)


def info_nce(relevance, scores, temperature: float = 0.07):
    """InfoNCE: the N-pair loss on logits ``S / temperature``."""
    return softmax_per_positive(relevance, scores / _positive(temperature, "temperature", "InfoNCE"))


def symmetric_info_nce(relevance, scores, temperature: float = 0.07):
    """CLIP's loss: ``(InfoNCE(S) + InfoNCE(S^T)) / 2`` by row and column log-sum-exps (no transpose)."""
    logits = scores / _positive(temperature, "temperature", "SymmetricInfoNCE")
    return 0.5 * (softmax_per_positive(relevance, logits, 1) + softmax_per_positive(relevance, logits, 0))


@register
class NPairLoss(RetrievalLoss):
    """Sohn (2016): ``log(1 + sum_k exp(scale * (s_ik - s_ij)))`` per positive pair; see module docstring."""

    function = npair
    default_name = "npair_loss"
    has_logit_scale = True

    def __init__(self, scale: float = 1.0, **kwargs):
        scale = _positive(scale, "scale", "NPairLoss")
        super().__init__(**kwargs)
        self.scale = scale


@register
class InfoNCE(RetrievalLoss):
    """InfoNCE with logits ``S / temperature``; ``bidirectional=True`` gives CLIP's symmetric loss."""

    function = info_nce
    has_logit_scale = True  # λ = 1 / temperature

    @classmethod
    def logit_scale_kwargs(cls, scale: float) -> dict:
        return {"temperature": 1.0 / float(scale)}

    @property
    def logit_scale(self) -> float:
        return 1.0 / self.temperature

    def __init__(self, temperature: float = 0.07, **kwargs):
        temperature = _positive(temperature, "temperature", type(self).__name__)
        super().__init__(**kwargs)
        self.temperature = temperature


@register
class SymmetricInfoNCE(InfoNCE):
    """CLIP's loss: ``(InfoNCE(S) + InfoNCE(S^T)) / 2``; always bidirectional (rows and columns of S, no
    transpose: column log-sum-exps)."""

    function = symmetric_info_nce
    supports_bidirectional = False  # it is bidirectional by definition; the flag is not a choice here

    def __init__(self, temperature: float = 0.07, **kwargs):
        if not kwargs.pop("bidirectional", True):
            raise ValueError("SymmetricInfoNCE is always bidirectional; use InfoNCE for one direction")
        super().__init__(temperature=temperature, **kwargs)


__all__ = ["InfoNCE", "NPairLoss", "SymmetricInfoNCE"]
