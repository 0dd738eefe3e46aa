"""Training: strategies, callbacks and the ``model.fit`` trainer (``train``), and ``load_trained``."""

from ce_retrieval.training.trainer import load_trained, prepare_process, train

__all__ = ["load_trained", "prepare_process", "train"]
