"""Keras losses on a similarity matrix S [N, M] and a relevance matrix in {-1, 0, 1} (docs/losses.md).

One family per module (``softmax.py``, ``triplet.py``, ...), each holding the family's loss function (its
mathematics, ``fn(relevance, scores, **hyper) -> scalar``) and the thin Keras classes that call it. This
package exports the public names only: the loss classes, the registry (``get``, ``available``, ``lookup``,
``register``), the relevance helpers and constants, :class:`AnnealingStepCallback`, and the functional API as
the module :mod:`ce_retrieval.losses.functional`. ``ce_retrieval.losses.get('cross_example_softmax')`` finds a
class by any of its names (``registry.aliases``), including its default Keras ``name``.
"""

from ce_retrieval.losses import functional, miners
from ce_retrieval.losses.angular import AngularLoss
from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.base import mean_over_positives as mean_over_positives  # for subclasses' compute
from ce_retrieval.losses.base import validate_similarity_inputs as validate_similarity_inputs  # for custom losses
from ce_retrieval.losses.binomial import BinomialDevianceLoss
from ce_retrieval.losses.centroid import CentroidUpperBoundLoss
from ce_retrieval.losses.circle import CircleLoss
from ce_retrieval.losses.contrastive import ContrastiveLoss
from ce_retrieval.losses.goal import GradientObjective
from ce_retrieval.losses.lifted import LiftedStructureLoss
from ce_retrieval.losses.lmnn import LMNNLoss, lmnn_target_relevance
from ce_retrieval.losses.margin_softmax import (
    AdditiveMarginSoftmax,
    AngularSoftmax,
    AnnealingStepCallback,
    ArcMarginSoftmax,
    LargeMarginSoftmax,
)
from ce_retrieval.losses.multi_similarity import MultiSimilarityLoss
from ce_retrieval.losses.nca import NCALoss
from ce_retrieval.losses.npair import InfoNCE, NPairLoss, SymmetricInfoNCE
from ce_retrieval.losses.proxy_anchor import ProxyAnchorLoss
from ce_retrieval.losses.proxy_nca import ProxyNCALoss
from ce_retrieval.losses.registry import available, get, lookup, register
from ce_retrieval.losses.regularizers import DivergenceLoss, SphericalEmbeddingConstraint
from ce_retrieval.losses.relevance import IGNORED, IRRELEVANT, RELEVANT, relevance_from_ids
from ce_retrieval.losses.sigmoid import SigmoidLoss
from ce_retrieval.losses.soft_triple import SoftTripleLoss
from ce_retrieval.losses.softmax import (
    CrossExampleNegativeMining,
    CrossExampleSoftmax,
    SampledSoftmax,
    StochasticNegativeMining,
)
from ce_retrieval.losses.softmax_core import SoftmaxFamilyLoss
from ce_retrieval.losses.threshold_consistent import ThresholdConsistentMargin
from ce_retrieval.losses.triplet import TripletLoss

__all__ = [
    # the loss contract and its registry
    "RetrievalLoss",
    "available",
    "get",
    "lookup",
    "register",
    # relevance matrices
    "IGNORED",
    "IRRELEVANT",
    "RELEVANT",
    "lmnn_target_relevance",
    "relevance_from_ids",
    # the functional API (ce_retrieval.losses.functional) and the miners (ce_retrieval.losses.miners)
    "functional",
    "miners",
    # the softmax family (Veit & Wilber 2020) and the margin softmax losses
    "SoftmaxFamilyLoss",
    "SampledSoftmax",
    "StochasticNegativeMining",
    "CrossExampleSoftmax",
    "CrossExampleNegativeMining",
    "LargeMarginSoftmax",
    "AngularSoftmax",
    "AdditiveMarginSoftmax",
    "ArcMarginSoftmax",
    "AnnealingStepCallback",
    # N-pair / InfoNCE
    "NPairLoss",
    "InfoNCE",
    "SymmetricInfoNCE",
    # SigLIP's pairwise sigmoid
    "SigmoidLoss",
    # pair and triplet losses
    "ContrastiveLoss",
    "TripletLoss",
    "LiftedStructureLoss",
    "AngularLoss",
    "MultiSimilarityLoss",
    "CircleLoss",
    "BinomialDevianceLoss",
    # neighbourhood and proxy losses
    "NCALoss",
    "LMNNLoss",
    "ProxyNCALoss",
    "ProxyAnchorLoss",
    "SoftTripleLoss",
    "CentroidUpperBoundLoss",
    # GOAL
    "GradientObjective",
    # embedding regularisers
    "DivergenceLoss",
    "SphericalEmbeddingConstraint",
    # a regulariser of the cosine matrix, added to any loss (loss.regularizers)
    "ThresholdConsistentMargin",
]
