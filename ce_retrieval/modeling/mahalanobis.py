"""Linear metric learning (ProbML 16.2.1): a learned Mahalanobis distance ``d_M(x, y)² = ‖W(x − y)‖²``.

``M = WᵀW`` is positive semi-definite by construction, and a rectangular ``W`` (``rank < D``) gives a
low-rank metric and a low-dimensional embedding ``z = Wx`` at once. LMNN and NCA are then plain Keras
training of::

    x -> MahalanobisProjection(rank) -> PairwiseNegativeSquaredDistance() -> S = −d_M²  [N, N]

with ``LMNNLoss(similarity='negative_squared_distance')`` or ``NCALoss(similarity=...)`` and relevance
from labels (``relevance_from_ids(y, y, exclude_self=True)``). After training, ``projection(x)`` is the
embedding in which Euclidean distance is ``d_M``.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class MahalanobisProjection(tf_keras.layers.Layer):
    """``z = x Wᵀ`` (stored as the ``[D, rank]`` kernel ``Wᵀ``); ``metric()`` returns ``M = WᵀW``.

    ``kernel_initializer='identity'`` (default) starts from the Euclidean metric (``W = I`` truncated to
    ``rank`` rows), the usual starting point of LMNN and NCA.
    """

    def __init__(self, rank: int, kernel_initializer="identity", kernel_regularizer=None, **kwargs):
        super().__init__(**kwargs)
        if int(rank) < 1:
            raise ValueError(f"MahalanobisProjection: rank must be >= 1, got {rank}")
        self.rank = int(rank)
        self.kernel_initializer = tf_keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)

    def build(self, input_shape) -> None:
        dim = tf.TensorShape(input_shape)[-1]
        if dim is None:
            raise ValueError("MahalanobisProjection: the feature dimension (last input axis) must be known")
        self.kernel = self.add_weight(
            name="kernel",
            shape=(int(dim), self.rank),
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            trainable=True,
        )
        super().build(input_shape)

    def call(self, x) -> tf.Tensor:
        return tf.matmul(tf.cast(x, self.compute_dtype), tf.cast(self.kernel, self.compute_dtype))

    def metric(self) -> tf.Tensor:
        """The ``[D, D]`` PSD matrix ``M = WᵀW`` (float32)."""
        w_t = tf.cast(self.kernel, tf.float32)
        return tf.matmul(w_t, w_t, transpose_b=True)

    def squared_distance(self, x, y) -> tf.Tensor:
        """``d_M(x_i, y_i)²`` for paired rows of ``x`` and ``y``."""
        diff = tf.cast(self(x), tf.float32) - tf.cast(self(y), tf.float32)
        return tf.reduce_sum(tf.square(diff), axis=-1)

    def compute_output_shape(self, input_shape) -> tf.TensorShape:
        return tf.TensorShape(input_shape)[:-1].concatenate([self.rank])

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            rank=self.rank,
            kernel_initializer=tf_keras.initializers.serialize(self.kernel_initializer),
            kernel_regularizer=tf_keras.regularizers.serialize(self.kernel_regularizer)
            if self.kernel_regularizer is not None
            else None,
        )
        return config


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class PairwiseNegativeSquaredDistance(tf_keras.layers.Layer):
    """``S[i, j] = −‖z_i − z_j‖²`` for a batch ``z`` ``[N, L]`` (or ``[z_q, z_d]`` for two sets).

    Computed in float32 as ``2 z_i·z_j − ‖z_i‖² − ‖z_j‖²`` and clamped at 0 (the diagonal is exactly 0),
    whatever the mixed-precision policy.
    """

    def __init__(self, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)

    def call(self, inputs) -> tf.Tensor:
        if isinstance(inputs, (list, tuple)):
            queries, docs = inputs
        else:
            queries = docs = inputs
        queries = tf.cast(queries, tf.float32)
        docs = tf.cast(docs, tf.float32)
        sq_q = tf.reduce_sum(tf.square(queries), axis=-1)[:, None]
        sq_d = tf.reduce_sum(tf.square(docs), axis=-1)[None, :]
        d2 = tf.maximum(sq_q + sq_d - 2.0 * tf.matmul(queries, docs, transpose_b=True), 0.0)
        if not isinstance(inputs, (list, tuple)):
            d2 = tf.linalg.set_diag(d2, tf.zeros_like(tf.linalg.diag_part(d2)))
        return -d2


__all__ = ["MahalanobisProjection", "PairwiseNegativeSquaredDistance"]
