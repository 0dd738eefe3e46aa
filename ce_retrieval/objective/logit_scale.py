"""λ, the logit scale of ``l = λ·S``: a fixed number, or learned as ``s = log λ`` (CLIP), capped.

    λ = λ₀                              (fixed: given to the loss as the number λ₀)
    λ = min(e^s, λ_max),  s₀ = log λ₀   (learned: given to the loss as a tensor, which it folds into S)

The loss is constructed with λ₀ and given the current λ at every call (``losses/base.py``, "λ and b at call").

One learned scoring scalar of the objective (:class:`ce_retrieval.objective.RetrievalObjective`); the next ones
(SigLIP's bias b) take the same shape: an object that is called for its value and lists its
``trainable_variables``. The variable may be lent by a model that tracks it under its own name
(``TwoTowerModel`` keeps ``log_logit_scale`` so checkpoints keep restoring).
"""

from __future__ import annotations

import math

import tensorflow as tf

from ce_retrieval.losses.kernels.softmax import DEFAULT_LOGIT_SCALE

#: λ_max, the cap of a learned λ (CLIP's 100).
DEFAULT_MAX_LOGIT_SCALE = 100.0


class LogitScale:
    """λ, fixed or learned (module docstring).

    Args:
      initial: λ₀ > 0 (the value if fixed, the start if learned).
      learn: learn ``s = log λ``.
      maximum: λ_max, the cap of a learned λ.
      variable: the float32 scalar variable holding ``s`` (learned only; created when not given).
    """

    def __init__(
        self,
        initial: float = DEFAULT_LOGIT_SCALE,
        learn: bool = False,
        maximum: float = DEFAULT_MAX_LOGIT_SCALE,
        variable=None,
    ):
        for label, value in (("logit_scale", initial), ("max_logit_scale", maximum)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{label} must be a positive finite number, got {value!r}")
        self.initial, self.learn, self.maximum = float(initial), bool(learn), float(maximum)
        if variable is not None and not self.learn:
            raise ValueError("LogitScale: a variable is only used with learn=True")
        if self.learn and variable is None:
            variable = tf.Variable(math.log(self.initial), dtype=tf.float32, trainable=True, name="log_logit_scale")
        self.variable = variable

    def __call__(self) -> tf.Tensor:
        """λ as a float32 scalar tensor."""
        if self.learn:
            return tf.minimum(tf.exp(tf.cast(self.variable, tf.float32)), self.maximum)
        return tf.constant(self.initial, tf.float32)

    def given(self) -> float | tf.Tensor:
        """λ as the loss is given it: the number λ₀ when fixed (the loss's own arithmetic, as its constructor's
        value), the float32 tensor when learned."""
        return self() if self.learn else self.initial

    @property
    def trainable_variables(self) -> list:
        return [self.variable] if self.learn else []


__all__ = ["DEFAULT_LOGIT_SCALE", "DEFAULT_MAX_LOGIT_SCALE", "LogitScale"]
