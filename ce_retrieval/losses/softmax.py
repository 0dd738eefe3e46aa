"""The four objectives of Veit & Wilber, "Improving Calibration in Deep Metric Learning With Cross-Example
Softmax" (2020, §3, eqs. 2-6), on a similarity matrix S and relevance R (docs/losses.md).

With logits l = scale * S and P the positive pairs (R == 1), every loss is

    L = 1/|P| sum_{(i,j) in P} -log( e^{l_ij} / (e^{l_ij} + sum_{s in Neg(i)} e^s) )

and they differ in the negative set Neg(i) (built from R == 0 only; ignored pairs, R == -1, appear nowhere):

=============================  =====  ======================================================================
class                          eq.    Neg(i)
=============================  =====  ======================================================================
``SampledSoftmax``             (2)    Neg_i: the negatives of row i (in-batch sampled softmax)
``StochasticNegativeMining``   (3)    topk(Neg_i), k = ceil(f * |Neg_i|) per row (f = 0.5), or ``top_k``
``CrossExampleSoftmax``        (5)    Neg: every negative of the batch, shared by all queries
``CrossExampleNegativeMining`` (6)    topk(Neg), k = ceil(f * |Neg|) over the whole batch, or ``top_k``
=============================  =====  ======================================================================

With R = I this is exactly the paper's 1/N sum_i; with several positives per row, each positive pair is
its own term and the other positives of the row are in neither numerator nor partition function.
Cross-example negatives make scores comparable across queries (global calibration, the paper's PR-AUC
gain); the mining variants keep the hardest 50% as in the paper's experiments. Mining uses an exact
radix selection of the k-th largest negative instead of a sort (``kernels/fast_paths.py``), so it costs a few
counting passes; ties at the threshold are counted exactly. The pipeline is in ``kernels/softmax.py``.

Functional core (``ce_retrieval.losses.functional``): :func:`sampled_softmax`, :func:`stochastic_negative_mining`,
:func:`cross_example_softmax`, :func:`cross_example_negative_mining`, each ``fn(relevance, scores, **hyper)``.

Any batch size: ``loss.from_embeddings(Q, D, query_ids, doc_ids)`` computes the same loss on ``S = Q Dᵀ`` with
relevance from ids, by the exact tiled path (``kernels/tiled.py``, no ``[N, M]`` matrix) when the constructor's
``tile_size=T`` is set or ``N·M > 2^26``, else densely; ``tile_size`` is in ``get_config`` when set.

Every logit is a single entry ``s_ij`` of a query's row (or of the batch's negatives): a two-tower text × image
matrix is the intended input and no Gram matrix is needed (``needs_gram`` is false).
"""

from __future__ import annotations

from ce_retrieval.losses.kernels.softmax import DEFAULT_LOGIT_SCALE, resolve_mining, softmax_loss
from ce_retrieval.losses.registry import register
from ce_retrieval.losses.softmax_core import SoftmaxFamilyLoss

#: the paper's mining setting: keep the hardest half of the negatives
DEFAULT_NEGATIVE_FRACTION = 0.5


def sampled_softmax(relevance, scores, scale: float = DEFAULT_LOGIT_SCALE):
    """Eq. (2): each positive pair against the negatives of its own row, logits ``scale * S``."""
    return softmax_loss(relevance, scores, scale, cross_example=False, owner="sampled_softmax")


def stochastic_negative_mining(
    relevance,
    scores,
    scale: float = DEFAULT_LOGIT_SCALE,
    negative_fraction: float | None = None,
    top_k: int | None = None,
):
    """Eq. (3): each positive pair against the top ``ceil(f * n_i)`` (or ``min(top_k, n_i)``) negatives of its row;
    ``f`` defaults to 0.5."""
    fraction, top_k = resolve_mining(negative_fraction, top_k, DEFAULT_NEGATIVE_FRACTION, "stochastic_negative_mining")
    return softmax_loss(relevance, scores, scale, False, fraction, top_k, owner="stochastic_negative_mining")


def cross_example_softmax(relevance, scores, scale: float = DEFAULT_LOGIT_SCALE):
    """Eq. (5): each positive pair against every negative of the batch (cross-example negatives)."""
    return softmax_loss(relevance, scores, scale, cross_example=True, owner="cross_example_softmax")


def cross_example_negative_mining(
    relevance,
    scores,
    scale: float = DEFAULT_LOGIT_SCALE,
    negative_fraction: float | None = None,
    top_k: int | None = None,
):
    """Eq. (6): each positive pair against the top ``ceil(f * n)`` (or ``min(top_k, n)``) negatives of the whole
    batch; ``f`` defaults to 0.5."""
    owner = "cross_example_negative_mining"
    fraction, top_k = resolve_mining(negative_fraction, top_k, DEFAULT_NEGATIVE_FRACTION, owner)
    return softmax_loss(relevance, scores, scale, True, fraction, top_k, owner=owner)


@register
class SampledSoftmax(SoftmaxFamilyLoss):
    """Eq. (2): in-batch sampled softmax; each positive pair against the negatives of its own row.

    Args:
      scale: logit scale (the paper's temperature lambda = 20 on cosine similarities).
      bidirectional: also apply the loss to S^T (image -> text) and average, as CLIP does.
    """

    function = sampled_softmax

    def __init__(
        self, scale: float = DEFAULT_LOGIT_SCALE, bidirectional: bool = False, name: str | None = None, **kwargs
    ):
        super().__init__(scale=scale, cross_example=False, bidirectional=bidirectional, name=name, **kwargs)


class _NegativeMiningSoftmax(SoftmaxFamilyLoss):
    """Eqs. (3) and (6) share everything but the negative set (per row or across the batch: ``cross_example``)."""

    cross_example = False
    default_negative_fraction = DEFAULT_NEGATIVE_FRACTION

    def __init__(
        self,
        scale: float = DEFAULT_LOGIT_SCALE,
        negative_fraction: float | None = None,
        top_k: int | None = None,
        bidirectional: bool = False,
        name: str | None = None,
        **kwargs,
    ):
        super().__init__(
            scale=scale,
            cross_example=self.cross_example,
            negative_fraction=negative_fraction,
            top_k=top_k,
            bidirectional=bidirectional,
            name=name,
            **kwargs,
        )


@register
class StochasticNegativeMining(_NegativeMiningSoftmax):
    """Eq. (3): sampled softmax over the top-k negatives of each row.

    Args:
      scale: logit scale.
      negative_fraction: f in (0, 1]; row i keeps k_i = ceil(f * n_i) of its n_i negatives (n_i excludes
        ignored pairs, so it may differ per row). Default 0.5 (the paper's setting).
      top_k: keep min(top_k, n_i) negatives per row instead of a fraction.
      bidirectional: also apply to S^T and average.
    """

    function = stochastic_negative_mining


@register
class CrossExampleSoftmax(SoftmaxFamilyLoss):
    """Eq. (5): every positive pair against all negatives of the batch (cross-example negatives).

    Args:
      scale: logit scale.
      bidirectional: also apply to S^T and average (the negative set is the same; the positives' rows change).
    """

    function = cross_example_softmax

    def __init__(
        self, scale: float = DEFAULT_LOGIT_SCALE, bidirectional: bool = False, name: str | None = None, **kwargs
    ):
        super().__init__(scale=scale, cross_example=True, bidirectional=bidirectional, name=name, **kwargs)


@register
class CrossExampleNegativeMining(_NegativeMiningSoftmax):
    """Eq. (6): every positive pair against the top-k negatives of the whole batch.

    Args:
      scale: logit scale.
      negative_fraction: f in (0, 1]; keeps k = ceil(f * n) of the batch's n negatives. Default 0.5.
      top_k: keep min(top_k, n) negatives instead of a fraction.
      bidirectional: also apply to S^T and average.
    """

    cross_example = True
    function = cross_example_negative_mining


__all__ = ["SampledSoftmax", "StochasticNegativeMining", "CrossExampleSoftmax", "CrossExampleNegativeMining"]
