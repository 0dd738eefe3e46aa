"""ce_retrieval.evaluation: top-k relevancy (Recall@K) and threshold relevancy (global PR-AUC) of two towers.

Metrics take embeddings + ids (NumPy or tensors) and need only NumPy; the names below are imported on first
use, so ``from ce_retrieval.evaluation import global_pr_auc`` does not load TensorFlow or matplotlib.
See docs in each module: ``calibration`` (exact streamed PR-AUC), ``transfer`` (do thresholds calibrated on one
split keep their precision on another; per-query threshold spread), ``retrieval`` (Recall@K, distractors, ANN
loss), ``search`` (exact chunked top-k), ``ann`` (ScaNN), ``embed``, ``evaluate`` (JSON + plots), ``callback``
(Keras), ``plots``, ``report`` / ``cli`` (the ``report`` and ``evaluate`` commands).
"""
import importlib

_EXPORTS = {
    "global_pr_auc": "calibration",
    "threshold_for_precision": "calibration",
    "threshold_transfer": "transfer",
    "per_query_thresholds": "transfer",
    "reliability_curve": "transfer",
    "calibration_summary": "transfer",
    "RELIABILITY_LEVELS": "transfer",
    "recall_at_k": "retrieval",
    "recall_with_distractors": "retrieval",
    "ann_recall_loss": "retrieval",
    "hits_at_k": "retrieval",
    "exact_search": "search",
    "ExactSearch": "search",
    "ScannSearch": "ann",
    "embed_split": "embed",
    "embed_strings": "embed",
    "evaluate_model": "evaluate",
    "evaluate_embeddings": "evaluate",
    "dataset_fingerprint": "evaluate",
    "RetrievalEvaluationCallback": "callback",
    "paired_difference": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
