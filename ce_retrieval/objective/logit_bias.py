"""b, the logit bias of ``l = λ·S + b`` (SigLIP): a fixed number, or learned.

    b = b₀                    (fixed: given to the loss as the number b₀)
    b = b_var,  b_var₀ = b₀   (learned: given to the loss as a tensor; the loss forms λ·S + b once)

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

    def given(self) -> float | tf.Tensor:
        """b as the loss is given it: the number b₀ when fixed, the float32 tensor when learned."""
        return self() if self.learn else self.initial

    @property
    def trainable_variables(self) -> list:
        return [self.variable] if self.learn else []


__all__ = ["LogitBias"]
