"""ce_retrieval.evaluation: top-k relevancy (Recall@K) and threshold relevancy (global PR-AUC) of two towers.

Metrics take embeddings + ids (NumPy or tensors). See docs in each module: ``calibration`` (exact streamed
PR-AUC), ``transfer`` (do thresholds calibrated on one split keep their precision on another; per-query threshold
spread), ``opis`` (operating-point inconsistency: how unequally one threshold serves the queries), ``probability``
(isotonic score -> P(relevant) map, its ECE and reliability diagram; ``probability_report`` prints runs side by
side), ``retrieval`` (Recall@K, distractors, ANN loss; the exact and ScaNN search it measures are in
:mod:`ce_retrieval.search`), ``labelled`` (Recall@K, MAP@R, NMI of labelled embeddings), ``embed``, ``evaluate``
(JSON + plots), ``callback`` and ``labelled_callback`` (Keras), ``plots``, ``report`` (tables of evaluation JSONs).
The ``evaluate`` and ``report`` commands are in :mod:`ce_retrieval.cli`.
"""

from ce_retrieval.evaluation.calibration import global_pr_auc, threshold_for_precision
from ce_retrieval.evaluation.callback import RetrievalEvaluationCallback
from ce_retrieval.evaluation.embed import embed_split, embed_strings
from ce_retrieval.evaluation.evaluate import dataset_fingerprint, evaluate_embeddings, evaluate_model
from ce_retrieval.evaluation.labelled import labelled_retrieval_metrics
from ce_retrieval.evaluation.labelled_callback import LabelledRetrievalCallback
from ce_retrieval.evaluation.opis import calibration_range, operating_point_inconsistency, opis
from ce_retrieval.evaluation.report import paired_difference
from ce_retrieval.evaluation.retrieval import ann_recall_loss, recall_at_k, recall_with_distractors
from ce_retrieval.evaluation.transfer import (
    RELIABILITY_LEVELS,
    calibration_summary,
    per_query_thresholds,
    reliability_curve,
    threshold_transfer,
)

__all__ = [
    "RELIABILITY_LEVELS",
    "LabelledRetrievalCallback",
    "RetrievalEvaluationCallback",
    "ann_recall_loss",
    "calibration_range",
    "calibration_summary",
    "dataset_fingerprint",
    "embed_split",
    "embed_strings",
    "evaluate_embeddings",
    "evaluate_model",
    "global_pr_auc",
    "labelled_retrieval_metrics",
    "operating_point_inconsistency",
    "opis",
    "paired_difference",
    "per_query_thresholds",
    "recall_at_k",
    "recall_with_distractors",
    "reliability_curve",
    "threshold_for_precision",
    "threshold_transfer",
]
