"""The losses of :mod:`ce_retrieval.losses` as Keras 3 ``keras.losses.Loss`` classes, and a similarity layer.

``from ce_retrieval.keras import CrossExampleSoftmax`` gives the Keras 3 class of the same name, arguments and
defaults as the tf_keras one, computing through it (one implementation; see :mod:`ce_retrieval.keras.losses` for
the conventions and the id form of ``y_true``; ``AngularSoftmax`` anneals with :class:`AnnealingStepCallback`).
:class:`SimilarityMatrix` turns two embedding sets into the cosine matrix ``S`` that the losses read, so an
ordinary two-input Keras 3 model trains with ``model.compile(loss=CrossExampleSoftmax())``.
:class:`RetrievalObjectiveLayer` is the two-tower model's whole objective instead (embeddings and ids -> loss,
``add_loss``; gather, tiled / sharded paths, learned λ: :mod:`ce_retrieval.keras.objective`). The losses and the
objective layer need the TensorFlow backend; ``SimilarityMatrix`` runs on any backend.
"""

from ce_retrieval.keras import losses
from ce_retrieval.keras.callbacks import AnnealingStepCallback
from ce_retrieval.keras.layers import SimilarityMatrix
from ce_retrieval.keras.losses import EXCLUDED, LOSSES, RetrievalLoss, available, get
from ce_retrieval.keras.objective import RetrievalObjectiveLayer

globals().update(LOSSES)

__all__ = [
    "AnnealingStepCallback",
    "EXCLUDED",
    "LOSSES",
    "RetrievalLoss",
    "RetrievalObjectiveLayer",
    "SimilarityMatrix",
    "available",
    "get",
    "losses",
    *sorted(LOSSES),
]
