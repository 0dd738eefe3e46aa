"""Keras 3 callbacks for the losses of :mod:`ce_retrieval.keras`.

:class:`AnnealingStepCallback` is the Keras 3 twin of :class:`ce_retrieval.losses.AnnealingStepCallback`: an
annealed loss (``AngularSoftmax``: λ = max(λ_min, λ_base (1 + γ·step)^-power)) reads its training step from a
variable held by the loss, and this callback sets that variable to ``model.optimizer.iterations`` before every
training batch, so the annealing follows the optimizer's step count (also after a resume from a checkpoint).
"""

from __future__ import annotations

import warnings

import keras
import numpy as np

from ce_retrieval.keras.losses import RetrievalLoss


class AnnealingStepCallback(keras.callbacks.Callback):
    """Keeps the ``step`` of the annealed losses in ``losses`` (default: the compiled model's) equal to the
    optimizer's iteration count."""

    def __init__(self, losses: RetrievalLoss | list[RetrievalLoss] | None = None):
        super().__init__()
        self._losses = None if losses is None else (list(losses) if isinstance(losses, (list, tuple)) else [losses])

    def _targets(self) -> list[RetrievalLoss]:
        if self._losses is not None:
            candidates = self._losses
        else:
            loss = getattr(self.model, "loss", None)
            candidates = (
                list(loss.values())
                if isinstance(loss, dict)
                else list(loss)
                if isinstance(loss, (list, tuple))
                else [loss]
            )
        return [c for c in candidates if isinstance(c, RetrievalLoss) and c.core.annealed]

    def _sync(self) -> None:
        iterations = int(np.asarray(keras.ops.convert_to_numpy(self.model.optimizer.iterations)))
        for loss in self._targets():
            loss.core.step.assign(iterations)

    def on_train_begin(self, logs=None) -> None:
        if not self._targets():
            warnings.warn(
                "AnnealingStepCallback: the compiled model has no annealed ce_retrieval loss; pass the loss "
                "instance: AnnealingStepCallback(loss)",
                stacklevel=2,
            )
        self._sync()

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self._sync()


__all__ = ["AnnealingStepCallback"]
