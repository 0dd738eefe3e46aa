"""A Keras callback that evaluates retrieval (Recall@K, rsum) and calibration (global PR-AUC) during ``fit``.

Every ``every_n_epochs`` epochs it embeds a :class:`RetrievalSplit` with ``model.text_encoder`` and
``model.image_encoder`` (batched, inference mode), computes the metrics and writes them into the epoch's
``logs`` with the prefix ``val_`` (``val_pr_auc``, ``val_average_precision``, ``val_rsum``, ``val_t2i_r1``, ...),
so ``History``, ``EarlyStopping`` and ``ModelCheckpoint(monitor="val_pr_auc", mode="max")`` see them -- put this
callback *before* those in the ``callbacks`` list. With ``log_dir`` the same scalars go to TensorBoard
(``<log_dir>/retrieval``), step = epoch (1-based).

With ``pr_auc`` on it also logs ``threshold_spread`` / ``relative_threshold_spread`` (how far apart the queries'
own best thresholds lie, see ``transfer.per_query_thresholds``) and ``opis`` / ``i2t_opis`` (the operating-point
inconsistency of caption / image queries over the span of the split's own thresholds for the precisions
0.05 ... 0.95, see ``opis``); given a ``calibration_split`` too (e.g. a held-out part of validation) it
calibrates thresholds for the precisions 0.05 ... 0.95 on that split at every evaluation and logs the precision
they achieve on ``split`` (``achieved_precision_0.5/0.8/0.9``) and their ``mean_calibration_error``.
Figures without a value (a level unreachable on the calibration split, nothing predicted, no score gap, no
calibration range) are logged as NaN.
"""

from __future__ import annotations

import os

import tensorflow as tf
import tf_keras

from ce_retrieval.evaluation.calibration import global_pr_auc
from ce_retrieval.evaluation.embed import embed_split
from ce_retrieval.evaluation.opis import operating_point_inconsistency, opis_summary
from ce_retrieval.evaluation.retrieval import recall_at_k
from ce_retrieval.evaluation.transfer import (
    RELIABILITY_LEVELS,
    calibration_summary,
    per_query_thresholds,
    threshold_transfer,
)

__all__ = ["RetrievalEvaluationCallback"]


class RetrievalEvaluationCallback(tf_keras.callbacks.Callback):
    """Adds ``<prefix>pr_auc``, ``<prefix>average_precision``, ``<prefix>best_f1``, ``<prefix>rsum``,
    ``<prefix>{t2i,i2t}_r{K}``, ``<prefix>threshold_spread``, ``<prefix>relative_threshold_spread``,
    ``<prefix>opis``, ``<prefix>i2t_opis`` and (with a ``calibration_split``)
    ``<prefix>achieved_precision_{0.5,0.8,0.9}``, ``<prefix>mean_calibration_error`` to the logs of every
    ``every_n_epochs``-th epoch (and of the last one)."""

    def __init__(
        self,
        split,
        every_n_epochs: int = 1,
        batch_size: int = 256,
        ks=(1, 5, 10),
        log_dir: str | None = None,
        prefix: str = "val_",
        pr_auc: bool = True,
        verbose: int = 0,
        calibration_split=None,
    ):
        super().__init__()
        if int(every_n_epochs) < 1:
            raise ValueError(f"every_n_epochs must be at least 1, got {every_n_epochs}")
        self.split = split
        self.calibration_split = calibration_split
        self.every_n_epochs = int(every_n_epochs)
        self.batch_size = int(batch_size)
        self.ks = tuple(ks)
        self.prefix = prefix
        self.pr_auc = bool(pr_auc)
        self.verbose = int(verbose)
        self.log_dir = log_dir
        self._writer = None
        self.last_results: dict | None = None

    def _encoders(self):
        model = self.model
        for name in ("text_encoder", "image_encoder"):
            if not isinstance(getattr(model, name, None), tf_keras.Model):
                raise ValueError(f"RetrievalEvaluationCallback needs a model with a Keras `{name}` attribute")
        return model.text_encoder, model.image_encoder

    def evaluate(self) -> dict:
        """The metrics now, as ``{name: float}`` without the prefix."""
        text_encoder, image_encoder = self._encoders()
        q, d, qi, di = embed_split(text_encoder, image_encoder, self.split, self.batch_size)
        recall = recall_at_k(q, d, qi, di, ks=self.ks)
        out = {"rsum": recall["rsum"]}
        for direction in ("t2i", "i2t"):
            for k, v in recall[direction].items():
                out[f"{direction}_r{k}"] = v
        if self.pr_auc:
            cal = global_pr_auc(q, d, qi, di, target_precisions=RELIABILITY_LEVELS)
            out.update(pr_auc=cal["pr_auc"], average_precision=cal["average_precision"], best_f1=cal["best_f1"]["f1"])
            spread = per_query_thresholds(q, d, qi, di)
            transfer = None
            if self.calibration_split is not None:
                cq, cd, cqi, cdi = embed_split(text_encoder, image_encoder, self.calibration_split, self.batch_size)
                thresholds = global_pr_auc(cq, cd, cqi, cdi, target_precisions=RELIABILITY_LEVELS)[
                    "threshold_at_precision"
                ]
                transfer = threshold_transfer(thresholds, q, d, qi, di)
            figures = calibration_summary(transfer, spread)
            figures.update(opis_summary(operating_point_inconsistency(q, d, qi, di, cal["threshold_at_precision"])))
            keys = ["threshold_spread", "relative_threshold_spread", "opis", "i2t_opis"]
            if transfer is not None:
                keys = [f"achieved_precision_{c}" for c in ("0.5", "0.8", "0.9")] + ["mean_calibration_error"] + keys
            out.update({k: float("nan") if figures[k] is None else float(figures[k]) for k in keys})
        return out

    def on_epoch_end(self, epoch, logs=None) -> None:
        last = self.params.get("epochs") if self.params else None
        if (epoch + 1) % self.every_n_epochs and (last is None or epoch + 1 != last):
            return
        results = self.evaluate()
        self.last_results = results
        if logs is not None:
            logs.update({self.prefix + k: v for k, v in results.items()})
        if self.log_dir:
            if self._writer is None:
                self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "retrieval"))
            with self._writer.as_default():
                for k, v in results.items():
                    tf.summary.scalar(self.prefix + k, v, step=epoch + 1)
            self._writer.flush()
        if self.verbose:
            text = ", ".join(f"{self.prefix}{k}: {v:.4f}" for k, v in results.items())
            print(f"\nEpoch {epoch + 1} retrieval: {text}")

    def on_train_end(self, logs=None) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
