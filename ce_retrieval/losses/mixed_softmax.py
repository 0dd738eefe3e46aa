"""Mixed partition softmax: the per-row (eq. 2) and the cross-example (eq. 5) softmax of Veit & Wilber (2020)
in one loss, with an optional warm-up of the cross-example share (issue 21, part 3; docs/losses.md).

    L = (1 - α_t) · L_row + α_t · L_cross,      α_t = α · min(1, t / T)    (T = ``warmup_steps``; T = 0: α_t = α)

with, for logits l = λ·S and P the positive pairs,

    L_row   = 1/|P| Σ_{(i,j)∈P} softplus(log Σ_{s∈Neg_i} e^s − l_ij)     (``SampledSoftmax``)
    L_cross = 1/|P| Σ_{(i,j)∈P} softplus(log Σ_{s∈Neg}   e^s − l_ij)     (``CrossExampleSoftmax``)

Why. L_row only ranks each query's documents; L_cross also shares one partition function Z over the B² pairs,
so it pushes every row's scores onto one scale (global calibration). The mixture keeps the ranking signal of
every query and part of the calibration. α = 0 is Sampled Softmax, α = 1 (no warm-up) Cross-Example Softmax,
exactly. Measured in benchmarks/results/recipe.md: between SS and CE in the converged heads regime; it does not
cure CE's slow start from scratch at λ = 20 on the demo (a lower λ does, for SS as well).

The warm-up reads a training-step variable ``step`` that :class:`~ce_retrieval.losses.AnnealingStepCallback`
keeps equal to the optimizer's step (the retrieval task adds it for every ``annealed`` loss). Dense path only:
it declares neither ``supports_tiled`` nor ``supports_sharded``, so ``tile_size`` and the retrieval objective's
tiled and sharded paths refuse it with the alternatives named.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.kernels.softmax import DEFAULT_LOGIT_SCALE, check_scale, softmax_loss
from ce_retrieval.losses.registry import register
from ce_retrieval.losses.softmax_core import SoftmaxFamilyLoss


def check_cross_weight(cross_weight, owner: str) -> float:
    """``cross_weight`` α as a float if it is a number in [0, 1], else a ``ValueError`` naming ``owner``."""
    if isinstance(cross_weight, bool) or not isinstance(cross_weight, (int, float)) or not 0 <= cross_weight <= 1:
        raise ValueError(f"{owner}: cross_weight must be a number in [0, 1], got {cross_weight!r}")
    return float(cross_weight)


def mixed_softmax(relevance, scores, scale: float = DEFAULT_LOGIT_SCALE, cross_weight=0.5) -> tf.Tensor:
    """``(1 − α) · L_row + α · L_cross`` on logits ``scale · S`` (module docstring); ``cross_weight`` α is a number
    in [0, 1] or a scalar tensor (the warmed-up value)."""
    owner = "mixed_softmax"
    scale = check_scale(scale, owner)
    if not tf.is_tensor(cross_weight):
        cross_weight = check_cross_weight(cross_weight, owner)
    alpha = tf.cast(cross_weight, tf.float32)
    row = softmax_loss(relevance, scores, scale, cross_example=False, owner=owner)
    cross = softmax_loss(relevance, scores, scale, cross_example=True, owner=owner)
    return (1.0 - alpha) * row + alpha * cross


@register
class MixedSoftmax(SoftmaxFamilyLoss):
    """``(1 − α_t) · SampledSoftmax + α_t · CrossExampleSoftmax``, α_t warmed up linearly from 0 to α over
    ``warmup_steps`` training steps (module docstring).

    Args:
      cross_weight: α in [0, 1], the cross-example share after the warm-up. Default 0.5.
      warmup_steps: T >= 0 steps of linear warm-up of α (0: α from the first step).
      scale: logit scale λ.
      bidirectional: also apply to S^T and average.
    """

    function = mixed_softmax
    annealed = True
    supports_tiled = False
    supports_sharded = False

    def __init__(
        self,
        cross_weight: float = 0.5,
        warmup_steps: int = 0,
        scale: float = DEFAULT_LOGIT_SCALE,
        bidirectional: bool = False,
        name: str | None = None,
        **kwargs,
    ):
        super().__init__(scale=scale, cross_example=False, bidirectional=bidirectional, name=name, **kwargs)
        self.cross_weight = check_cross_weight(cross_weight, self.name)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"{self.name}: warmup_steps must be a non-negative integer, got {warmup_steps!r}")
        self.warmup_steps = int(warmup_steps)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{self.name}_step")

    def current_cross_weight(self, step=None) -> tf.Tensor:
        """α_t = α · min(1, t / T) at ``step`` (default: the current ``self.step``), float32."""
        if self.warmup_steps == 0:
            return tf.constant(self.cross_weight, tf.float32)
        t = tf.cast(self.step if step is None else step, tf.float32)
        return self.cross_weight * tf.minimum(1.0, t / float(self.warmup_steps))

    def function_kwargs(self) -> dict:  # the function takes the current α, not its schedule
        return dict(scale=self.scale, cross_weight=self.current_cross_weight())


__all__ = ["MixedSoftmax", "mixed_softmax"]
