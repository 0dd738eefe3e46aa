"""The functional core of :mod:`ce_retrieval.losses`: every loss family as ``fn(relevance, scores, **hyper) -> scalar``.

Each function here is the mathematics that a Keras class of the package runs (the class's ``compute`` calls the
same function with the constructor's arguments), wrapped with the class's input validation::

    from ce_retrieval.losses import functional as F
    F.cross_example_softmax(relevance, scores, scale=20.0)
    F.triplet(relevance, scores, margin=0.2, mining="semi-hard")
    F.info_nce(relevance, scores, temperature=0.07, bidirectional=True)
    F.sigmoid_loss(relevance, scores, scale=10.0, bias=-10.0)

* ``relevance`` (``y_true``) and ``scores`` (``y_pred``, the similarity matrix ``S``) are ``[N, M]``; the value
  is a float32 scalar whatever the input dtype (float16 / bfloat16 inputs are computed in float32);
* inputs are checked as by the classes (rank, shapes, dtypes, relevance values in {-1, 0, 1}, at least one
  positive pair, finite scores and, for :func:`angular`, a Gram matrix): ``ValueError`` for what static shapes
  and dtypes show, ``tf.errors.InvalidArgumentError`` at run time;
* ``bidirectional=True`` (keyword, where the class offers it) averages with the loss on ``(Rᵀ, Sᵀ)``;
* no replica scaling, like the Keras classes: the caller's step scales (``docs/losses.md``).

The hyper-parameters and their defaults are the classes' (see each family's module for the equations).
"""

from __future__ import annotations

import functools

import tensorflow as tf

from ce_retrieval.losses import angular as _angular
from ce_retrieval.losses import binomial as _binomial
from ce_retrieval.losses import centroid as _centroid
from ce_retrieval.losses import circle as _circle
from ce_retrieval.losses import contrastive as _contrastive
from ce_retrieval.losses import goal as _goal
from ce_retrieval.losses import lifted as _lifted
from ce_retrieval.losses import lmnn as _lmnn
from ce_retrieval.losses import margin_softmax as _margin
from ce_retrieval.losses import mixed_softmax as _mixed
from ce_retrieval.losses import multi_similarity as _multi_similarity
from ce_retrieval.losses import nca as _nca
from ce_retrieval.losses import npair as _npair
from ce_retrieval.losses import proxy_anchor as _proxy_anchor
from ce_retrieval.losses import proxy_nca as _proxy_nca
from ce_retrieval.losses import sigmoid as _sigmoid
from ce_retrieval.losses import soft_triple as _soft_triple
from ce_retrieval.losses import softmax as _softmax
from ce_retrieval.losses import softmax_core as _softmax_core
from ce_retrieval.losses import threshold_consistent as _threshold_consistent
from ce_retrieval.losses import triplet as _triplet
from ce_retrieval.losses.base import validate_similarity_inputs
from ce_retrieval.losses.kernels import softmax as _softmax_kernel
from ce_retrieval.losses.kernels import tiled as _tiled


def _validated(function, cls):
    """``function`` with the input validation of ``cls`` (its ``needs_gram`` and ``supports_bidirectional``)."""
    name = function.__name__
    gram, two_way = cls.needs_gram, cls.supports_bidirectional

    def loss(relevance, scores, *, bidirectional: bool = False, **hyper):
        if bidirectional and not two_way:
            raise ValueError(f"{name} does not support bidirectional=True")
        relevance, scores = validate_similarity_inputs(relevance, scores, name, gram=gram)
        value = function(relevance, scores, **hyper)
        if bidirectional:
            value = 0.5 * (value + function(tf.transpose(relevance), tf.transpose(scores), **hyper))
        return value

    functools.update_wrapper(loss, function)
    loss.__module__ = __name__
    two_way_note = "; ``bidirectional=True`` averages with the loss on (Rᵀ, Sᵀ)" if two_way else ""
    loss.__doc__ = (function.__doc__ or "").rstrip() + (
        f"\n\n    Inputs validated as by :class:`ce_retrieval.losses.{cls.__name__}` (module docstring){two_way_note}."
    )
    # no tensor-dependent Python control flow: autograph's conversion would only cost trace time
    loss = tf.autograph.experimental.do_not_convert(loss)
    loss.__wrapped__ = function  # inspect.signature shows the family function's hyper-parameters
    return loss


# The softmax family (Veit & Wilber 2020 and the margin losses).
softmax_loss = _validated(_softmax_kernel.softmax_loss, _softmax_core.SoftmaxFamilyLoss)
sampled_softmax = _validated(_softmax.sampled_softmax, _softmax.SampledSoftmax)
stochastic_negative_mining = _validated(_softmax.stochastic_negative_mining, _softmax.StochasticNegativeMining)
cross_example_softmax = _validated(_softmax.cross_example_softmax, _softmax.CrossExampleSoftmax)
cross_example_negative_mining = _validated(_softmax.cross_example_negative_mining, _softmax.CrossExampleNegativeMining)
large_margin_softmax = _validated(_margin.large_margin_softmax, _margin.LargeMarginSoftmax)
angular_softmax = _validated(_margin.angular_softmax, _margin.AngularSoftmax)
additive_margin_softmax = _validated(_margin.additive_margin_softmax, _margin.AdditiveMarginSoftmax)
arc_margin_softmax = _validated(_margin.arc_margin_softmax, _margin.ArcMarginSoftmax)
mixed_softmax = _validated(_mixed.mixed_softmax, _mixed.MixedSoftmax)
# The same family from embeddings and ids, over column tiles (no [N, M] matrix; validates its own inputs).
tiled_softmax_loss = _tiled.tiled_softmax_loss
# N-pair / InfoNCE.
npair = _validated(_npair.npair, _npair.NPairLoss)
info_nce = _validated(_npair.info_nce, _npair.InfoNCE)
symmetric_info_nce = _validated(_npair.symmetric_info_nce, _npair.SymmetricInfoNCE)
# SigLIP's pairwise sigmoid.
sigmoid_loss = _validated(_sigmoid.sigmoid_loss, _sigmoid.SigmoidLoss)
# Pair and triplet losses.
contrastive = _validated(_contrastive.contrastive, _contrastive.ContrastiveLoss)
triplet = _validated(_triplet.triplet, _triplet.TripletLoss)
lifted_structure = _validated(_lifted.lifted_structure, _lifted.LiftedStructureLoss)
angular = _validated(_angular.angular, _angular.AngularLoss)
multi_similarity = _validated(_multi_similarity.multi_similarity, _multi_similarity.MultiSimilarityLoss)
circle = _validated(_circle.circle, _circle.CircleLoss)
binomial_deviance = _validated(_binomial.binomial_deviance, _binomial.BinomialDevianceLoss)
# Neighbourhood and proxy losses.
nca = _validated(_nca.nca, _nca.NCALoss)
lmnn = _validated(_lmnn.lmnn, _lmnn.LMNNLoss)
proxy_nca = _validated(_proxy_nca.proxy_nca, _proxy_nca.ProxyNCALoss)
proxy_anchor = _validated(_proxy_anchor.proxy_anchor, _proxy_anchor.ProxyAnchorLoss)
soft_triple = _validated(_soft_triple.soft_triple, _soft_triple.SoftTripleLoss)
centroid_upper_bound = _validated(_centroid.centroid_upper_bound, _centroid.CentroidUpperBoundLoss)
# Threshold-Consistent Margin, a regulariser of cosine similarities.
threshold_consistent_margin = _validated(
    _threshold_consistent.threshold_consistent_margin, _threshold_consistent.ThresholdConsistentMargin
)
# GOAL (a logging value with a prescribed gradient).
gradient_objective = _validated(_goal.gradient_objective, _goal.GradientObjective)

__all__ = [
    "additive_margin_softmax",
    "angular",
    "angular_softmax",
    "arc_margin_softmax",
    "binomial_deviance",
    "centroid_upper_bound",
    "circle",
    "contrastive",
    "cross_example_negative_mining",
    "cross_example_softmax",
    "gradient_objective",
    "info_nce",
    "large_margin_softmax",
    "lifted_structure",
    "lmnn",
    "mixed_softmax",
    "multi_similarity",
    "nca",
    "npair",
    "proxy_anchor",
    "proxy_nca",
    "sampled_softmax",
    "sigmoid_loss",
    "soft_triple",
    "softmax_loss",
    "stochastic_negative_mining",
    "symmetric_info_nce",
    "threshold_consistent_margin",
    "tiled_softmax_loss",
    "triplet",
]
