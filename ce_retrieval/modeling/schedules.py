"""Learning-rate schedule of the paper's two optimizers: linear warm-up, then linear decay.

    lr(t) = peak * t / W                                   for t < W
    lr(t) = peak + (end - peak) * min(t - W, T - W) / (T - W)   for t >= W

``t`` is the optimizer's step counter (0 for the first update), ``W`` the warm-up steps and ``T`` the total
steps (lr = end from T on). Text tower: peak 1e-4, W = 1,500, end 0. Image tower: peak 3e-3, W = 0, end 5e-4.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class WarmupLinearDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to ``peak_learning_rate`` over ``warmup_steps``, then linear decay to
    ``end_learning_rate`` at ``total_steps``."""

    def __init__(
        self,
        peak_learning_rate: float,
        total_steps: int,
        warmup_steps: int = 0,
        end_learning_rate: float = 0.0,
        name: str | None = None,
    ):
        super().__init__()
        if total_steps <= 0:
            raise ValueError(f"WarmupLinearDecay: total_steps must be positive, got {total_steps}")
        if not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                f"WarmupLinearDecay: warmup_steps must be in [0, total_steps={total_steps}], got {warmup_steps}"
            )
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.end_learning_rate = float(end_learning_rate)
        self.name = name

    def __call__(self, step):
        with tf.name_scope(self.name or "warmup_linear_decay"):
            t = tf.cast(step, tf.float32)
            peak = tf.constant(self.peak_learning_rate, tf.float32)
            end = tf.constant(self.end_learning_rate, tf.float32)
            warmup = float(self.warmup_steps)
            decay_steps = float(max(self.total_steps - self.warmup_steps, 1))
            progress = tf.clip_by_value((t - warmup) / decay_steps, 0.0, 1.0)
            decayed = peak + (end - peak) * progress
            if self.warmup_steps == 0:
                return decayed
            return tf.where(t < warmup, peak * t / warmup, decayed)

    def get_config(self) -> dict:
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "end_learning_rate": self.end_learning_rate,
            "name": self.name,
        }


__all__ = ["WarmupLinearDecay"]
