"""Small Keras layers shared by both towers.

``L2Normalize``: e = x / sqrt(max(||x||_2^2, eps)), computed in float32 whatever the mixed-precision policy, so
embeddings leave each tower as unit-norm float32 vectors and the cosine similarity is ``<e_t, e_v>``.
"""
from __future__ import annotations

import tensorflow as tf


@tf.keras.utils.register_keras_serializable(package="ce_retrieval")
class L2Normalize(tf.keras.layers.Layer):
    """Casts to float32 and L2-normalises along the last axis."""

    def __init__(self, epsilon: float = 1e-12, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def call(self, inputs):
        x = tf.cast(inputs, tf.float32)
        return tf.math.l2_normalize(x, axis=-1, epsilon=self.epsilon)

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


__all__ = ["L2Normalize"]
