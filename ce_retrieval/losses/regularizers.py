"""Embedding regularisers that compose with any loss of this package: ``total = loss + weight * penalty``.

``SphericalEmbeddingConstraint`` (SEC; Zhang et al. 2020, "Deep metric learning with spherical embedding";
ProbML 16.2.6): the batch variance of the norms of the *un-normalised* embeddings,

    L_sec = 1/B sum_i (||f_i|| - mu)^2,        mu = 1/B sum_i ||f_i||

so that all points sit on one sphere before the L2 normalisation that feeds the cosine similarity. It is a
``tf_keras.regularizers.Regularizer`` for ``activity_regularizer=`` of the layer that outputs the raw
embedding (it must see the embedding *before* normalisation). Keras divides an activity regulariser by the
batch size, so, like Keras' own ``L2``, ``__call__`` returns the batch *sum* ``weight * sum_i (||f_i|| - mu)^2``
and the loss Keras adds is exactly ``weight * L_sec``::

    raw = tf_keras.layers.Dense(128, activity_regularizer=SphericalEmbeddingConstraint(0.1))(features)
    emb = tf.math.l2_normalize(raw, axis=-1)      # model.losses then holds 0.1 * L_sec

``DivergenceLoss`` (Kim et al. 2018, "Attention-based ensemble for deep metric learning"): pushes the K heads
of an ensemble apart on the same input,

    L_div = 1/B sum_i sum_{a < b} [m - ||f_a(x_i) - f_b(x_i)||^2]_+        (margin m = 1)

on L2-normalised head embeddings. It is a layer: call it on the list of head outputs (each ``[B, D]``) or on
a stacked ``[B, K, D]`` tensor; it adds ``weight * L_div`` with ``add_loss`` and returns its input unchanged,
so ``model.fit`` minimises ``metric_loss + weight * L_div`` (the paper sums the per-head metric losses and
adds lambda * L_div). Both compute in float32 under mixed precision.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class SphericalEmbeddingConstraint(tf_keras.regularizers.Regularizer):
    """SEC: ``weight * sum_i (||f_i|| - mean_j ||f_j||)^2`` (Keras divides by the batch size); see module doc."""

    def __init__(self, weight: float = 1.0):
        if weight < 0:
            raise ValueError(f"SphericalEmbeddingConstraint: weight must be >= 0, got {weight}")
        self.weight = float(weight)

    def __call__(self, x):
        x = tf.convert_to_tensor(x)
        if x.shape.rank is not None and x.shape.rank < 2:
            raise ValueError(f"SphericalEmbeddingConstraint expects embeddings [batch, ..., dim], got shape {x.shape}")
        x = tf.cast(x, tf.float32)
        norms = tf.norm(tf.reshape(x, [-1, tf.shape(x)[-1]]), axis=-1)
        return self.weight * tf.reduce_sum(tf.square(norms - tf.reduce_mean(norms)))

    def get_config(self) -> dict:
        return {"weight": self.weight}


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class DivergenceLoss(tf_keras.layers.Layer):
    """Adds ``weight * mean_i sum_{a<b} [m - ||f_a - f_b||^2]_+`` over ensemble heads; see module doc."""

    def __init__(self, margin: float = 1.0, weight: float = 1.0, normalize: bool = True, **kwargs):
        super().__init__(**kwargs)
        if margin <= 0 or weight < 0:
            raise ValueError(f"DivergenceLoss: need margin > 0 and weight >= 0, got {margin}, {weight}")
        self.margin, self.weight, self.normalize = float(margin), float(weight), bool(normalize)

    def call(self, heads) -> tf.Tensor:
        stacked = tf.stack(heads, axis=1) if isinstance(heads, (list, tuple)) else heads
        if stacked.shape.rank != 3:
            raise ValueError(
                f"DivergenceLoss expects a list of [batch, dim] head embeddings or a [batch, heads, dim] tensor, "
                f"got shape {stacked.shape}"
            )
        if stacked.shape[1] is not None and stacked.shape[1] < 2:
            raise ValueError(f"DivergenceLoss needs at least 2 heads, got {stacked.shape[1]}")
        x = tf.cast(stacked, tf.float32)
        if self.normalize:
            x = tf.math.l2_normalize(x, axis=-1)
        gram = tf.matmul(x, x, transpose_b=True)  # [B, K, K]
        sq_norm = tf.linalg.diag_part(gram)
        squared = tf.maximum(sq_norm[:, :, None] + sq_norm[:, None, :] - 2.0 * gram, 0.0)
        k = tf.shape(x)[1]
        upper = tf.linalg.band_part(tf.ones([k, k]), 0, -1) - tf.eye(k)  # pairs a < b
        per_example = tf.reduce_sum(upper * tf.nn.relu(self.margin - squared), axis=[1, 2])
        self.add_loss(self.weight * tf.reduce_mean(per_example))
        return heads

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(margin=self.margin, weight=self.weight, normalize=self.normalize)
        return config


__all__ = ["DivergenceLoss", "SphericalEmbeddingConstraint"]
