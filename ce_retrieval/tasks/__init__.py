"""Tasks: an experiment config turned into model, loss, optimizers, data and callbacks (one owner for each)."""

from ce_retrieval.tasks.loss_wiring import build_loss, build_regularizers, loss_parameters
from ce_retrieval.tasks.retrieval import RetrievalTask

__all__ = ["RetrievalTask", "build_loss", "build_regularizers", "loss_parameters"]
