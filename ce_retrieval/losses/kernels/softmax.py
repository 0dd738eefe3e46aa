"""The softmax family's mathematics (Veit & Wilber 2020, §3) as one pipeline of small named steps.

Every loss of ``softmax.py`` and ``margin_softmax.py`` is, for each positive pair (i, j) with logit l_ij,

    loss_ij = -log( e^{p_ij} / (e^{p_ij} + Z) ) = softplus(log Z - p_ij),   value = mean over positive pairs

and the classes differ only in the steps that produce ``p`` and ``Z``:

1. ``positive logit``: p_ij = scale * s_ij, or a margin transform of s_ij (L-Softmax, A-Softmax, CosFace,
   ArcFace); margins touch positives only.
2. ``negative set``: ``Neg_i`` = row i's negatives (y_true == 0), "sampled" (eq. 2), or ``Neg`` = all
   negatives of the batch, "cross-example" (eq. 5). Ignored pairs (-1) are in no set and no positive.
3. ``mining`` (optional): keep the top k of the set, k = ceil(f * n) (``negative_fraction=f``) or
   k = min(top_k, n), n = size of the set (per row, or the whole batch). Eqs. (3) and (6).
4. ``log partition``: log Z = log sum_{s in set} e^{scale * s}, by log-sum-exp with max subtraction.
   With mining, sum_{topk} e^s = sum_{s > t} e^s + (k - #{s > t}) e^t with t the k-th largest (found by
   radix selection, ``fast_paths.py``, no sort); the tied entries at t share the weight
   (k - #{s > t}) / #{s == t}, which is the same value and splits the gradient evenly among the ties.
   The threshold itself carries no gradient.
5. ``softmax cross-entropy`` per positive pair and the mean over positive pairs.

A row (or batch) without negatives has Z = 0: its positive pairs contribute 0 (log 1).

:func:`softmax_loss` is the whole pipeline as a function (the functional core of every class of the family,
``losses/softmax_core.py``); ``positive_cosine`` is the margin of step 1 (``None``: no margin). The same steps run
over column tiles (``tiled.py``) and sharded over replicas (``sharded.py``).
"""

from __future__ import annotations

import math

import tensorflow as tf

from ce_retrieval.losses.kernels.fast_paths import top_k_weights
from ce_retrieval.losses.kernels.masked import mean_over_positives
from ce_retrieval.losses.relevance import IRRELEVANT

_NEG_INF = float("-inf")

#: λ of the logits ``λ·S`` when none is given: the paper's value on cosine similarities. The one place the
#: number is written: the losses' defaults and the objective's (``ce_retrieval.objective.logit_scale``) read it.
DEFAULT_LOGIT_SCALE = 20.0


def check_scale(scale, owner: str) -> float | tf.Tensor:
    """``scale`` as a float if it is a positive finite number, a scalar tensor (a learned λ, positive by
    construction) as float32, else a ``ValueError`` naming ``owner``."""
    if tf.is_tensor(scale):
        if scale.shape.rank not in (None, 0):
            raise ValueError(f"{owner}: a scale tensor must be a scalar, got shape {scale.shape}")
        return tf.cast(scale, tf.float32)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{owner}: scale must be a positive finite number, got {scale!r}")
    return float(scale)


def resolve_mining(
    negative_fraction, top_k, default_fraction: float | None, owner: str
) -> tuple[float | None, int | None]:
    """Validated ``(negative_fraction, top_k)``: at most one is set; the default applies when neither is."""
    if negative_fraction is not None and top_k is not None:
        raise ValueError(f"{owner}: give either negative_fraction or top_k, not both")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"{owner}: top_k must be a positive integer, got {top_k!r}")
        return None, int(top_k)
    if negative_fraction is None:
        negative_fraction = default_fraction
    if negative_fraction is not None:
        if isinstance(negative_fraction, bool) or not isinstance(negative_fraction, (int, float)):
            raise ValueError(f"{owner}: negative_fraction must be a number in (0, 1], got {negative_fraction!r}")
        if not (0.0 < float(negative_fraction) <= 1.0):
            raise ValueError(f"{owner}: negative_fraction must be in (0, 1], got {negative_fraction!r}")
        negative_fraction = float(negative_fraction)
    return negative_fraction, None


def mining_k(num_negatives: tf.Tensor, negative_fraction: float | None, top_k: int | None) -> tf.Tensor:
    """Step 3: how many negatives to keep, ``ceil(f * n)`` or ``min(top_k, n)`` (int32, shape of ``n``)."""
    n = tf.cast(num_negatives, tf.int32)
    if top_k is not None:
        return tf.minimum(n, top_k)
    # float64 so that f * n is exact for batch-wide sets of up to 2^31 negatives.
    return tf.cast(tf.math.ceil(tf.cast(n, tf.float64) * negative_fraction), tf.int32)


def negative_log_partition(logits, negatives, cross_example: bool, negative_fraction=None, top_k=None) -> tf.Tensor:
    """Steps 2-4: ``log Z`` over the row's (shape ``[N, 1]``) or the batch's (shape ``[1, 1]``) negatives.

    ``logits`` float32 ``[N, M]``; ``negatives`` bool ``[N, M]``. Without mining (both ``None``) every
    negative counts. Sets without negatives give ``-inf`` (Z = 0).
    """
    axis = None if cross_example else -1
    masked = tf.where(negatives, logits, _NEG_INF)
    peak = _reduce(tf.reduce_max, masked, cross_example)
    nonempty = peak > _NEG_INF
    peak = tf.stop_gradient(tf.where(nonempty, peak, 0.0))
    exp = tf.exp(masked - peak)  # 0 outside the negative set, <= 1 inside
    if negative_fraction is not None or top_k is not None:
        exp = exp * _top_k_weights(masked, negatives, axis, negative_fraction, top_k)
    total = _reduce(tf.reduce_sum, exp, cross_example)
    return tf.where(nonempty, peak + tf.math.log(tf.where(nonempty, total, 1.0)), _NEG_INF)


def _reduce(reduce_fn, x, whole_batch: bool):
    """Row reduction ``[N, 1]``, or for the whole batch ``[1, 1]`` as rows then column: XLA on CPU runs a
    reduction to a scalar on one thread but parallelises the per-row one."""
    rows = reduce_fn(x, axis=-1, keepdims=True)
    return reduce_fn(rows, axis=0, keepdims=True) if whole_batch else rows


def _top_k_weights(masked, negatives, axis, negative_fraction, top_k):
    """Weights of the top-k negatives (``fast_paths.top_k_weights``), k = ``mining_k`` of the set's size.

    ``masked`` holds the logits of the negatives and -inf elsewhere; since k <= n, the k-th largest of
    ``masked`` is the k-th largest negative and the -inf fillers never reach the top k.
    """
    count = _reduce(tf.reduce_sum, tf.cast(negatives, tf.int32), axis is None)  # [N, 1] or [1, 1]
    k = tf.minimum(mining_k(count, negative_fraction, top_k), count)
    return top_k_weights(masked, k, axis=axis)


def softmax_pair_loss(positive_logits, log_partition, relevance) -> tf.Tensor:
    """Step 5: mean over positive pairs of ``-log(e^p / (e^p + Z)) = softplus(log Z - p)``."""
    return mean_over_positives(tf.math.softplus(log_partition - positive_logits), relevance)


def softmax_loss(
    relevance,
    scores,
    scale: float = DEFAULT_LOGIT_SCALE,
    cross_example: bool = False,
    negative_fraction: float | None = None,
    top_k: int | None = None,
    positive_cosine=None,
    owner: str = "softmax_loss",
) -> tf.Tensor:
    """The family's pipeline (module docstring), mean over positive pairs of ``softplus(log Z - p_ij)``.

    Args:
      relevance, scores: float32 ``[N, M]``.
      scale: logit scale λ (logits ``λ·S``): a number, or a scalar tensor (a learned λ).
      cross_example: ``Neg`` = every negative of the batch (eq. 5) instead of the row's (eq. 2).
      negative_fraction, top_k: mining (eqs. 3 and 6); at most one; ``None`` for both: every negative.
      positive_cosine: the margin, ``c -> margined c`` applied to the positives' similarities before ``scale``.
      owner: the name in error messages.
    """
    scale = check_scale(scale, owner)
    negative_fraction, top_k = resolve_mining(negative_fraction, top_k, None, owner)
    logits = scale * scores
    log_partition = negative_log_partition(
        logits, relevance == IRRELEVANT, bool(cross_example), negative_fraction, top_k
    )
    positive_logits = logits if positive_cosine is None else scale * positive_cosine(scores)
    return softmax_pair_loss(positive_logits, log_partition, relevance)


__all__ = [
    "DEFAULT_LOGIT_SCALE",
    "check_scale",
    "mining_k",
    "negative_log_partition",
    "resolve_mining",
    "softmax_loss",
    "softmax_pair_loss",
]
