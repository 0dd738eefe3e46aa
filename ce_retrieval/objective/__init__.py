"""The retrieval objective: from this replica's two embedding sets and their ids to the loss the step
differentiates, at any scale (dense, tiled, sharded, sharded + tiled; chosen by the config). See
:mod:`ce_retrieval.objective.objective` and docs/losses.md ("From embeddings to the loss").

Floors: ``losses`` (and ``utils``) below, ``modeling`` and ``keras`` above; this package imports neither of those.
"""

from ce_retrieval.objective.logit_bias import LogitBias
from ce_retrieval.objective.logit_scale import LogitScale
from ce_retrieval.objective.objective import ObjectiveResult, RetrievalObjective
from ce_retrieval.objective.paths import AUTO, LOSS_PARTITIONS, LossPath

__all__ = ["AUTO", "LOSS_PARTITIONS", "LogitBias", "LogitScale", "LossPath", "ObjectiveResult", "RetrievalObjective"]
