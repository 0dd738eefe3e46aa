"""The one loss contract of ce_retrieval (shared/spec/losses.md).

Every objective maps a similarity matrix ``S = y_pred`` of shape ``[N, M]`` (rows: queries, columns:
documents) and a relevance matrix ``R = y_true`` of the same shape (1 positive, 0 negative, -1 ignored) to a
scalar: the mean over positive pairs of a per-pair term. Subclasses implement :meth:`RetrievalLoss.compute`
on float32 tensors that have already been validated; this base class owns everything else:

* validation with clear errors (rank, shape, relevance values, no positive pair, non-finite scores),
  statically where shapes are known and with ``tf.debugging`` asserts at run time (eager and graph mode;
  XLA compiles asserts out, so under ``jit_compile=True`` only the static checks remain);
* float32 computation whatever the input dtype (float16/bfloat16 mixed precision);
* ``bidirectional=True``: mean of the loss on ``S`` (text->image) and on ``S^T`` (image->text), as CLIP;
* distribution: the value is divided by ``num_replicas_in_sync`` when called in a replica context.

Distributed semantics. The two-tower model gathers the embeddings of all replicas (``all_gather``), so each
replica passes the **global** ``[N_global, M_global]`` matrix and computes the same global loss ``L``. Keras
sums gradients over replicas, and the gradient of ``all_gather`` sums the upstream gradients of every replica,
so returning ``L / R`` per replica gives exactly ``dL/dtheta`` after the all-reduce, and a logged value of
``L`` after summing. If a caller passes a per-replica (local) matrix instead, the same scaling yields the mean
of the replicas' local losses. The reduction is therefore fixed to ``SUM`` (Keras must not rescale again);
``sample_weight`` is not supported (weight pairs through ``y_true`` instead).
"""
from __future__ import annotations

import tensorflow as tf

from ce_retrieval.losses.registry import register

RELEVANT, IRRELEVANT, IGNORED = 1.0, 0.0, -1.0


def replica_scale() -> float | tf.Tensor:
    """1 / num_replicas_in_sync inside a replica context of a multi-replica strategy, else 1."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None:  # cross-replica context: caller reduces itself
        return 1.0
    n = ctx.num_replicas_in_sync
    return 1.0 / n if n > 1 else 1.0


def validate_similarity_inputs(y_true, y_pred, name: str = "loss"):
    """Checks and casts ``(y_true, y_pred)``; returns float32 ``(relevance, scores)``.

    Raises ``ValueError`` for problems visible in static shapes, and adds run-time asserts that raise
    ``tf.errors.InvalidArgumentError`` for: relevance values outside {-1, 0, 1}, no positive pair, non-finite
    scores, and shape mismatches only known at run time.
    """
    y_pred = tf.convert_to_tensor(y_pred)
    y_true = tf.convert_to_tensor(y_true)
    if not (y_pred.dtype.is_floating):
        raise ValueError(f"{name}: y_pred (similarity scores) must be a floating tensor, got dtype {y_pred.dtype.name}")
    if y_true.dtype == tf.bool or not (y_true.dtype.is_floating or y_true.dtype.is_integer):
        raise ValueError(
            f"{name}: y_true (relevance) must be numeric with values in {{-1, 0, 1}}, got dtype {y_true.dtype.name}"
        )
    if y_pred.shape.rank is not None and y_pred.shape.rank != 2:
        raise ValueError(
            f"{name}: y_pred must be a rank-2 similarity matrix [num_queries, num_documents], got shape {y_pred.shape}"
        )
    if y_true.shape.rank is not None and y_true.shape.rank != 2:
        raise ValueError(
            f"{name}: y_true must be a rank-2 relevance matrix [num_queries, num_documents], got shape {y_true.shape}"
        )
    if y_true.shape.is_fully_defined() and y_pred.shape.is_fully_defined() and y_true.shape != y_pred.shape:
        raise ValueError(f"{name}: y_true shape {y_true.shape} does not match y_pred shape {y_pred.shape}")
    if y_pred.shape.num_elements() == 0:
        raise ValueError(f"{name}: empty batch (y_pred has shape {y_pred.shape})")

    scores = tf.cast(y_pred, tf.float32)
    relevance = tf.cast(y_true, tf.float32)
    checks = [
        tf.debugging.assert_equal(
            tf.shape(relevance), tf.shape(scores), message=f"{name}: y_true and y_pred shapes differ"
        ),
        tf.debugging.assert_greater(tf.size(scores), 0, message=f"{name}: empty batch"),
        tf.debugging.assert_equal(
            tf.reduce_all((relevance == RELEVANT) | (relevance == IRRELEVANT) | (relevance == IGNORED)),
            True,
            message=f"{name}: y_true (relevance) has values outside {{-1, 0, 1}}",
        ),
        tf.debugging.assert_equal(
            tf.reduce_any(relevance == RELEVANT), True, message=f"{name}: the batch has no positive pair (y_true == 1)"
        ),
        tf.debugging.assert_equal(
            tf.reduce_all(tf.math.is_finite(scores)), True, message=f"{name}: y_pred has NaN or Inf scores"
        ),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(relevance), tf.identity(scores)


class RetrievalLoss(tf.keras.losses.Loss):
    """Base class: validation, float32, bidirectional averaging, replica scaling. See module docstring."""

    #: Subclasses that may be applied to S^T set this to True to expose ``bidirectional=``.
    supports_bidirectional = True

    def __init__(self, bidirectional: bool = False, name: str | None = None, reduction=None, **kwargs):
        if bidirectional and not self.supports_bidirectional:
            raise ValueError(f"{type(self).__name__} does not support bidirectional=True")
        super().__init__(name=name or _snake(type(self).__name__), reduction=tf.keras.losses.Reduction.SUM, **kwargs)
        self.bidirectional = bool(bidirectional)

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError(
                f"{self.name}: sample_weight is not supported by similarity-matrix losses; "
                "mark pairs as ignored (-1) in y_true instead"
            )
        return super().__call__(y_true, y_pred)

    # No tensor-dependent Python control flow here or in ``compute``: skipping autograph's conversion saves most
    # of a loss's trace time.
    @tf.autograph.experimental.do_not_convert
    def call(self, y_true, y_pred):
        relevance, scores = validate_similarity_inputs(y_true, y_pred, self.name)
        value = self.compute(relevance, scores)
        if self.bidirectional:
            value = 0.5 * (value + self.compute(tf.transpose(relevance), tf.transpose(scores)))
        return value * replica_scale()

    def compute(self, relevance: tf.Tensor, scores: tf.Tensor) -> tf.Tensor:
        """Scalar float32 loss for validated ``relevance`` and ``scores`` (both float32 ``[N, M]``)."""
        raise NotImplementedError

    def get_config(self):
        config = super().get_config()
        config.pop("reduction", None)
        if self.supports_bidirectional:
            config["bidirectional"] = self.bidirectional
        return config


def mean_over_positives(per_pair: tf.Tensor, relevance: tf.Tensor) -> tf.Tensor:
    """Mean of ``per_pair[i, j]`` over positive pairs (relevance == 1); masked entries may be anything finite."""
    positive = tf.cast(relevance == RELEVANT, per_pair.dtype)
    total = tf.reduce_sum(tf.where(positive > 0, per_pair, tf.zeros_like(per_pair)))
    return total / tf.maximum(tf.reduce_sum(positive), 1.0)


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


__all__ = [
    "RELEVANT",
    "IRRELEVANT",
    "IGNORED",
    "RetrievalLoss",
    "mean_over_positives",
    "replica_scale",
    "validate_similarity_inputs",
    "register",
]
