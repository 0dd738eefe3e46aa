"""Angular- and cosine-margin softmax losses: the paper's margin baselines (Table 1) and their successors.

All four are the softmax pipeline of ``kernels/softmax.py`` with a margin on the positive logit only:

    loss_ij = -log( e^{p_ij} / (e^{p_ij} + sum_{s in Neg} e^{scale * s}) ),  mean over positive pairs (i, j)

Conventions. ``S`` holds cosine similarities c = cos(theta) of L2-normalised embeddings (values outside
[-1, 1] are clipped where an angle is needed, which stops their gradient); every logit, margined or not,
is multiplied by ``scale`` (default 20, the paper's lambda, so all losses of the family are comparable).
``cross_example=False`` uses the row's negatives (sampled softmax form, as in the original papers);
``cross_example=True`` the batch's negatives (cross-example form, eq. 5). ``bidirectional=True`` averages
with the loss on S^T.

==========================  ==================================================================  ============
class                       positive logit p_ij / scale                                         margin
==========================  ==================================================================  ============
``LargeMarginSoftmax``      psi_m(theta) = (-1)^k cos(m theta) - 2k, theta in [k pi/m, (k+1) pi/m]  m = 2 (int)
``AngularSoftmax``          (lambda cos(theta) + psi_m(theta)) / (1 + lambda), lambda annealed      m = 4 (int)
``AdditiveMarginSoftmax``   cos(theta) - m                                                       m = 0.35
``ArcMarginSoftmax``        cos(theta + m); cos(theta) - m sin(m) once theta + m > pi            m = 0.5
==========================  ==================================================================  ============

L-Softmax: Liu et al., ICML 2016. A-Softmax: Liu et al., SphereFace, CVPR 2017. CosFace: Wang et al.,
CVPR 2018. ArcFace: Deng et al., CVPR 2019. cos(m theta) is evaluated as the Chebyshev polynomial T_m(c)
(exact, smooth gradient, no arccos derivative); k = floor(m theta / pi) carries no gradient. ArcFace uses
sin(theta) = sqrt(max(1 - c^2, 1e-6)) so the gradient stays bounded at c = +-1, and the usual fallback
(insightface's ``easy_margin=False``) keeps the logit monotone in theta.

A-Softmax annealing. SphereFace trains with lambda = max(lambda_min, lambda_base (1 + gamma step)^-power)
(defaults 1000, 0.12, 1, 5), starting as plain softmax and moving to the margin. The loss owns a
non-trainable int64 variable ``step``; :class:`AnnealingStepCallback` sets it to
``model.optimizer.iterations`` before every training batch of ``model.fit``. Because the optimizer's
iteration count is saved with the model's checkpoint, a resumed run continues the schedule where it
stopped, and evaluation batches never advance it. Custom training loops call
``loss.step.assign(optimizer.iterations)`` themselves (or add ``loss.step`` to their checkpoint).

Functional core (``ce_retrieval.losses.functional``): :func:`large_margin_softmax`, :func:`angular_softmax`
(with the annealed ``lambda_`` given as a number or tensor), :func:`additive_margin_softmax`,
:func:`arc_margin_softmax`, each ``fn(relevance, scores, margin=..., scale=20, cross_example=False)``.
As for the rest of the softmax family, each logit is one entry ``s_ij``: ``needs_gram`` is false, and
``loss.from_embeddings(Q, D, query_ids, doc_ids)`` runs the exact column-tiled path (``kernels/tiled.py``) at any batch
size, with ``positive_cosine`` as its margin.

Learned λ. The margin acts on cosines, so these losses declare ``needs_cosine``: a learned λ given at call
(``logit_scale=`` of ``call``, ``sharded_share`` and ``tiled_loss``) is not folded into S but used as their λ, and
the logits are ``λ·s`` and ``λ·ψ(s)`` on every path, exactly the fixed-λ loss at the same λ, with the gradient
flowing into ``log λ`` (``base.py``, "λ and b at call").
"""

from __future__ import annotations

import math
import warnings

import tensorflow as tf
import tf_keras

from ce_retrieval.losses.base import RetrievalLoss
from ce_retrieval.losses.kernels.softmax import DEFAULT_LOGIT_SCALE, softmax_loss
from ce_retrieval.losses.registry import register
from ce_retrieval.losses.softmax_core import SoftmaxFamilyLoss


def chebyshev_cos_multiple(cosine: tf.Tensor, m: int) -> tf.Tensor:
    """cos(m theta) from c = cos(theta) via T_0 = 1, T_1 = c, T_{n+1} = 2 c T_n - T_{n-1}."""
    previous, current = tf.ones_like(cosine), cosine
    if m == 0:
        return previous
    for _ in range(m - 1):
        previous, current = current, 2.0 * cosine * current - previous
    return current


def psi(cosine: tf.Tensor, m: int) -> tf.Tensor:
    """L-Softmax's psi_m(theta) = (-1)^k cos(m theta) - 2k, k = floor(m theta / pi), monotone decreasing in theta."""
    cosine = tf.clip_by_value(cosine, -1.0, 1.0)
    theta = tf.math.acos(tf.stop_gradient(cosine))
    k = tf.clip_by_value(tf.floor(m * theta / math.pi), 0.0, float(m - 1))
    sign = 1.0 - 2.0 * tf.math.floormod(k, 2.0)
    return sign * chebyshev_cos_multiple(cosine, m) - 2.0 * k


def _check_margin(value, owner: str, integer: bool, upper: float | None = None):
    if integer:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}: margin must be a positive integer (angular multiplier m), got {value!r}")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{owner}: margin must be a non-negative number, got {value!r}")
    if upper is not None and value >= upper:
        raise ValueError(f"{owner}: margin must be < {upper:.4f}, got {value!r}")
    return float(value)


def sphereface_cosine(cosine: tf.Tensor, m: int, lambda_) -> tf.Tensor:
    """A-Softmax's margined cosine ``(lambda cos(theta) + psi_m(theta)) / (1 + lambda)``."""
    clipped = tf.clip_by_value(cosine, -1.0, 1.0)
    return (lambda_ * clipped + psi(cosine, m)) / (1.0 + lambda_)


def arcface_cosine(cosine: tf.Tensor, m: float) -> tf.Tensor:
    """ArcFace's ``cos(theta + m)``, and ``cos(theta) - m sin(m)`` where ``theta + m > pi``."""
    c = tf.clip_by_value(cosine, -1.0, 1.0)
    sine = tf.sqrt(tf.maximum(1.0 - c * c, 1e-6))
    shifted = c * math.cos(m) - sine * math.sin(m)
    # theta + m > pi  <=>  c < cos(pi - m)
    return tf.where(c > math.cos(math.pi - m), shifted, c - m * math.sin(m))


def large_margin_softmax(
    relevance, scores, margin: int = 2, scale: float = DEFAULT_LOGIT_SCALE, cross_example: bool = False
):
    """L-Softmax: positive logit ``scale * psi_m(theta)`` (integer ``margin`` m >= 1)."""
    m = _check_margin(margin, "large_margin_softmax", integer=True)
    return softmax_loss(
        relevance, scores, scale, cross_example, positive_cosine=lambda c: psi(c, m), owner="large_margin_softmax"
    )


def angular_softmax(
    relevance, scores, margin: int = 4, lambda_=5.0, scale: float = DEFAULT_LOGIT_SCALE, cross_example: bool = False
):
    """A-Softmax: positive logit ``scale * (lambda cos(theta) + psi_m(theta)) / (1 + lambda)``; ``lambda_`` is the
    annealed weight (a number or a tensor; the class computes it from its step; 5 is SphereFace's final value)."""
    m = _check_margin(margin, "angular_softmax", integer=True)
    return softmax_loss(
        relevance,
        scores,
        scale,
        cross_example,
        positive_cosine=lambda c: sphereface_cosine(c, m, lambda_),
        owner="angular_softmax",
    )


def additive_margin_softmax(
    relevance, scores, margin: float = 0.35, scale: float = DEFAULT_LOGIT_SCALE, cross_example: bool = False
):
    """CosFace / AM-Softmax: positive logit ``scale * (cos(theta) - m)``."""
    m = _check_margin(margin, "additive_margin_softmax", integer=False)
    return softmax_loss(
        relevance, scores, scale, cross_example, positive_cosine=lambda c: c - m, owner="additive_margin_softmax"
    )


def arc_margin_softmax(
    relevance, scores, margin: float = 0.5, scale: float = DEFAULT_LOGIT_SCALE, cross_example: bool = False
):
    """ArcFace: positive logit ``scale * cos(theta + m)`` (``m`` in [0, pi/2))."""
    m = _check_margin(margin, "arc_margin_softmax", integer=False, upper=math.pi / 2)
    return softmax_loss(
        relevance,
        scores,
        scale,
        cross_example,
        positive_cosine=lambda c: arcface_cosine(c, m),
        owner="arc_margin_softmax",
    )


class _MarginSoftmax(SoftmaxFamilyLoss):
    """Shared constructor: ``margin``, ``scale``, ``cross_example``, ``bidirectional``."""

    # the margin acts on cosines, so a learned λ is given to the loss (``logit_scale=``), not folded into S
    needs_cosine = True
    default_margin: float = 0.0
    integer_margin = False
    margin_upper: float | None = None

    def __init__(
        self,
        margin=None,
        scale: float = DEFAULT_LOGIT_SCALE,
        cross_example: bool = False,
        bidirectional: bool = False,
        name: str | None = None,
        **kwargs,
    ):
        super().__init__(scale=scale, cross_example=cross_example, bidirectional=bidirectional, name=name, **kwargs)
        margin = self.default_margin if margin is None else margin
        self.margin = _check_margin(margin, self.name, self.integer_margin, self.margin_upper)

    def positive_cosine(self, cosine: tf.Tensor) -> tf.Tensor:
        """The margined similarity of a positive pair, before ``scale``."""
        raise NotImplementedError


@register
class LargeMarginSoftmax(_MarginSoftmax):
    """L-Softmax (Liu et al. 2016): positive logit scale * psi_m(theta), psi_m(theta) = (-1)^k cos(m theta) - 2k.

    Args:
      margin: integer angular multiplier m >= 1 (m = 1 is plain softmax). Default 2.
      scale: logit scale. cross_example: batch-wide negatives. bidirectional: also on S^T.
    """

    function = large_margin_softmax
    default_margin = 2
    integer_margin = True

    def positive_cosine(self, cosine: tf.Tensor) -> tf.Tensor:
        return psi(cosine, self.margin)


@register
class AngularSoftmax(_MarginSoftmax):
    """A-Softmax / SphereFace (Liu et al. 2017):
    positive logit scale * (lambda cos(theta) + psi_m(theta)) / (1 + lambda).

    lambda = max(lambda_min, lambda_base * (1 + lambda_gamma * step) ** -lambda_power) decays with the training
    step held in ``self.step`` (see the module docstring and :class:`AnnealingStepCallback`).

    Args:
      margin: integer angular multiplier m >= 1. Default 4 (SphereFace).
      lambda_base, lambda_gamma, lambda_power, lambda_min: annealing schedule (SphereFace: 1000, 0.12, 1, 5).
      scale: logit scale. cross_example: batch-wide negatives. bidirectional: also on S^T.
    """

    function = angular_softmax
    annealed = True

    default_margin = 4
    integer_margin = True

    def __init__(
        self,
        margin=None,
        lambda_base: float = 1000.0,
        lambda_gamma: float = 0.12,
        lambda_power: float = 1.0,
        lambda_min: float = 5.0,
        scale: float = DEFAULT_LOGIT_SCALE,
        cross_example: bool = False,
        bidirectional: bool = False,
        name: str | None = None,
        **kwargs,
    ):
        super().__init__(
            margin=margin, scale=scale, cross_example=cross_example, bidirectional=bidirectional, name=name, **kwargs
        )
        for key, value in [
            ("lambda_base", lambda_base),
            ("lambda_gamma", lambda_gamma),
            ("lambda_power", lambda_power),
            ("lambda_min", lambda_min),
        ]:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{self.name}: {key} must be a non-negative finite number, got {value!r}")
        self.lambda_base = float(lambda_base)
        self.lambda_gamma = float(lambda_gamma)
        self.lambda_power = float(lambda_power)
        self.lambda_min = float(lambda_min)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{self.name}_step")

    def annealing_lambda(self, step=None) -> tf.Tensor:
        """lambda at ``step`` (default: the current ``self.step``), float32."""
        step = tf.cast(self.step if step is None else step, tf.float32)
        decayed = self.lambda_base * tf.pow(1.0 + self.lambda_gamma * step, -self.lambda_power)
        return tf.maximum(decayed, self.lambda_min)

    def positive_cosine(self, cosine: tf.Tensor) -> tf.Tensor:
        return sphereface_cosine(cosine, self.margin, self.annealing_lambda())

    def function_kwargs(self) -> dict:  # the function takes the current lambda, not its schedule
        return dict(
            margin=self.margin, lambda_=self.annealing_lambda(), scale=self.scale, cross_example=self.cross_example
        )


@register
class AdditiveMarginSoftmax(_MarginSoftmax):
    """CosFace / AM-Softmax (Wang et al. 2018): positive logit scale * (cos(theta) - m).

    Args:
      margin: additive cosine margin m >= 0. Default 0.35.
      scale: logit scale. cross_example: batch-wide negatives. bidirectional: also on S^T.
    """

    function = additive_margin_softmax
    default_margin = 0.35

    def positive_cosine(self, cosine: tf.Tensor) -> tf.Tensor:
        return cosine - self.margin


@register
class ArcMarginSoftmax(_MarginSoftmax):
    """ArcFace (Deng et al. 2019): positive logit scale * cos(theta + m), and scale * (cos(theta) - m sin(m))
    where theta + m > pi (keeps the logit decreasing in theta).

    Args:
      margin: additive angular margin m in [0, pi/2). Default 0.5.
      scale: logit scale. cross_example: batch-wide negatives. bidirectional: also on S^T.
    """

    function = arc_margin_softmax
    default_margin = 0.5
    margin_upper = math.pi / 2

    def positive_cosine(self, cosine: tf.Tensor) -> tf.Tensor:
        return arcface_cosine(cosine, self.margin)


class AnnealingStepCallback(tf_keras.callbacks.Callback):
    """Keeps the ``step`` variable of annealed losses (``AngularSoftmax``) equal to ``optimizer.iterations``.

    Args:
      losses: the loss objects to drive; default: every ``annealed`` loss of the compiled model (``model.loss``
        as an instance, list or dict).
    """

    def __init__(self, losses=None):
        super().__init__()
        self._losses = None if losses is None else (list(losses) if isinstance(losses, (list, tuple)) else [losses])

    def _targets(self):
        if self._losses is not None:
            return self._losses
        loss = getattr(self.model, "loss", None)
        candidates = (
            list(loss.values()) if isinstance(loss, dict) else list(loss) if isinstance(loss, (list, tuple)) else [loss]
        )
        return [c for c in candidates if isinstance(c, RetrievalLoss) and c.annealed]

    def _sync(self):
        iterations = self.model.optimizer.iterations
        for loss in self._targets():
            loss.step.assign(tf.cast(iterations, loss.step.dtype))

    def on_train_begin(self, logs=None) -> None:
        if not self._targets():
            warnings.warn(
                "AnnealingStepCallback: the compiled model has no loss with a `step` variable (was the loss "
                "given by name?); pass the loss instance: AnnealingStepCallback(loss)",
                stacklevel=2,
            )
        self._sync()

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self._sync()


__all__ = [
    "LargeMarginSoftmax",
    "AngularSoftmax",
    "AdditiveMarginSoftmax",
    "ArcMarginSoftmax",
    "AnnealingStepCallback",
]
