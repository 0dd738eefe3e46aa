"""The pairwise sigmoid loss of SigLIP (Zhai, Mustafa, Kolesnikov & Beyer 2023, "Sigmoid Loss for Language Image
Pre-Training", Algorithm 1; OpenCLIP ``SigLipLoss``).

Every pair (i, j) of S is its own binary classification, relevant or not, with logit ``t·s_ij + b``:

    L = -1/N · Σ_{i,j: R_ij ≠ -1} log σ(z_ij (t·s_ij + b)) = 1/N · Σ softplus(-z_ij (t·s_ij + b)),
    z_ij = +1 if R_ij = 1 (relevant), -1 if R_ij = 0;  ignored pairs (R_ij = -1) enter no term

normalised by N, the number of rows (queries) of S, as the paper's ``1/|B|`` and OpenCLIP's ``/ batch_size``: the
sum over pairs is not a mean over pairs, so a larger batch adds more negative terms per row. With one positive per
row and N = M this is exactly the paper's loss; several positives per row are each a z = +1 term.

No softmax ties the scores of a row (or of the batch) together: each score is pushed through a fixed sigmoid,
so ``σ(t·s + b)`` reads as an absolute probability of relevance and one threshold fits every query. The paper
learns the temperature ``t = exp(t')`` and the bias ``b`` (init ``t' = log 10``, ``b = -10``: the start
matches the imbalance of ~1 positive against N - 1 negatives per row); the retrieval objective owns both, like λ
(``ce_retrieval.objective``; config ``model.logit_scale`` / ``model.learn_logit_scale``, ``model.logit_bias`` /
``model.learn_logit_bias``, see ``ce_retrieval/tasks/loss_wiring.py``) and gives this loss their current values
at every call (``logit_scale=``, ``logit_bias=``; learned ones are folded into ``t·S + b``: ``base.py``, "λ and b
at call").

The sum over S equals the sum over Sᵀ, so ``bidirectional`` is not offered. Computed with ``softplus`` (stable
for any logit, float32). Each term reads one entry (``needs_gram`` is false). Functional core:
:func:`sigmoid_loss`.

Every path of the retrieval objective (``ce_retrieval.objective``): the terms of a row need nothing from other
rows but N, so the sharded share of replica r is ``1/N Σ_{i ∈ rows_r} Σ_j softplus(...)`` with N summed over
replicas (:meth:`SigmoidLoss.sharded_share`), and the tiled path streams column tiles with the gradient recomputed
tile by tile (``tiled_sigmoid.py``; sharded + tiled likewise).
"""

from __future__ import annotations

import math
import numbers

import tensorflow as tf

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.masked import pair_masks
from ce_retrieval.losses.kernels.tiled_sigmoid import tiled_sigmoid_loss
from ce_retrieval.losses.registry import register
from ce_retrieval.utils.replicas import replica_sum

#: the paper's initial temperature t = exp(log 10) and bias b
SIGLIP_SCALE = 10.0
SIGLIP_BIAS = -10.0


def _check(scale, bias, owner: str) -> tuple[float, float]:
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{owner}: scale (the temperature t) must be a positive finite number, got {scale!r}")
    if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not math.isfinite(bias):
        raise ValueError(f"{owner}: bias must be a finite number, got {bias!r}")
    return float(scale), float(bias)


def sigmoid_loss(relevance, scores, scale: float = SIGLIP_SCALE, bias: float = SIGLIP_BIAS):
    """SigLIP: ``1/N Σ_{R_ij ≠ -1} softplus(-z_ij (scale·s_ij + bias))``, z = +1 relevant, -1 irrelevant."""
    scale, bias = _check(scale, bias, "sigmoid_loss")
    positive, negative = pair_masks(relevance)
    logits = scale * scores + bias
    signed = tf.where(positive, logits, -logits)  # z·l
    terms = tf.where(positive | negative, tf.math.softplus(-signed), tf.zeros_like(logits))
    rows = tf.cast(tf.shape(scores)[0], scores.dtype)
    return tf.reduce_sum(tf.reduce_sum(terms, axis=-1)) / rows


@register
class SigmoidLoss(RetrievalLoss):
    """SigLIP's pairwise sigmoid loss, ``1/N Σ_ij softplus(-z_ij (t·s_ij + b))``; see module docstring.

    Args:
      scale: the temperature t (λ of the package: logits ``t·S + b``); 10 as the paper's initial value.
      bias: the logit bias b; -10 as the paper's initial value.
    """

    function = sigmoid_loss
    has_logit_scale = True
    has_logit_bias = True
    supports_bidirectional = False  # Σ over S equals Σ over Sᵀ
    supports_tiled = True
    supports_sharded = True

    def __init__(self, scale: float = SIGLIP_SCALE, bias: float = SIGLIP_BIAS, **kwargs):
        scale, bias = _check(scale, bias, "SigmoidLoss")
        super().__init__(**kwargs)
        self.scale, self.bias = scale, bias

    def sharded_share(self, relevance_local, scores_local, logit_scale=None, logit_bias=None) -> tf.Tensor:
        """This replica's share ``1/N Σ_{its rows} Σ_j softplus(-z (t·s + b))`` of the loss over every replica's
        rows (N: all replicas' rows, no gradient); the shares sum to the loss of the whole batch. ``logit_scale``,
        ``logit_bias``: t and b instead of this instance's (``base``'s module docstring, "λ and b at call")."""
        folded, kwargs = self.given_scalars(logit_scale, logit_bias)
        scale, bias = kwargs.get("logit_scale", self.scale), kwargs.get("logit_bias", self.bias)
        rows = tf.cast(tf.shape(scores_local)[0], tf.float32)
        local_sum = sigmoid_loss(relevance_local, folded.apply(tf.cast(scores_local, tf.float32)), scale, bias) * rows
        return local_sum / tf.maximum(tf.reshape(replica_sum(tf.stop_gradient(rows)), []), 1.0)

    def tiled_loss(
        self,
        query_emb,
        doc_emb,
        query_ids,
        doc_ids,
        tile_size: int | None = None,
        ignore_negative_ids: bool = False,
        across_replicas: bool = False,
        logit_scale=None,
        logit_bias=None,
    ) -> tf.Tensor:
        """This loss by the tiled path (``tiled_sigmoid.tiled_sigmoid_loss``: no ``[N, M]`` logits, forward or
        backward); ``across_replicas``: this replica's share of the loss of every replica's rows; ``logit_scale``,
        ``logit_bias``: t and b instead of this instance's (``base``'s module docstring, "λ and b at call")."""
        folded, kwargs = self.given_scalars(logit_scale, logit_bias)
        query_emb, doc_emb = self.fold_into_embeddings(query_emb, doc_emb, folded)
        return tiled_sigmoid_loss(
            query_emb,
            doc_emb,
            query_ids,
            doc_ids,
            kwargs.get("logit_scale", self.scale),
            kwargs.get("logit_bias", self.bias),
            tile_size,
            ignore_negative_ids,
            across_replicas,
        )


__all__ = ["SIGLIP_BIAS", "SIGLIP_SCALE", "SigmoidLoss"]
