"""b, the logit bias of ``l = λ·S + b`` (SigLIP): a fixed number, or learned.

    b = b₀        (fixed: the loss adds it itself, as its ``bias``)
    b = b_var,  b_var₀ = b₀   (learned: the objective adds it after λ; the loss has λ = 1, b = 0)

The second learned scoring scalar of the objective, shaped like :class:`ce_retrieval.objective.LogitScale`:
called for its value, listing its ``trainable_variables``. The variable may be lent by a model that tracks it
under its own name (``TwoTowerModel`` keeps the weight ``logit_bias`` so checkpoints keep restoring).
"""

from __future__ import annotations

import math
import numbers

import tensorflow as tf


class LogitBias:
    """b, fixed or learned (module docstring).

    Args:
      initial: b₀ (the value if fixed, the start if learned; SigLIP: -10).
      learn: learn b.
      variable: the float32 scalar variable holding b (learned only; created when not given).
    """

    def __init__(self, initial: float, learn: bool = False, variable=None):
        if isinstance(initial, bool) or not isinstance(initial, numbers.Real) or not math.isfinite(initial):
            raise ValueError(f"logit_bias must be a finite number, got {initial!r}")
        self.initial, self.learn = float(initial), bool(learn)
        if variable is not None and not self.learn:
            raise ValueError("LogitBias: a variable is only used with learn=True")
        if self.learn and variable is None:
            variable = tf.Variable(self.initial, dtype=tf.float32, trainable=True, name="logit_bias")
        self.variable = variable

    def __call__(self) -> tf.Tensor:
        """b as a float32 scalar tensor."""
        if self.learn:
            return tf.cast(tf.identity(self.variable), tf.float32)
        return tf.constant(self.initial, tf.float32)

    @property
    def trainable_variables(self) -> list:
        return [self.variable] if self.learn else []


__all__ = ["LogitBias"]
