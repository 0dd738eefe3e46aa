"""Small Keras layers shared by both towers.

``L2Normalize``: e = x / sqrt(max(||x||_2^2, eps)), computed in float32 whatever the mixed-precision policy, so
embeddings leave each tower as unit-norm float32 vectors and the cosine similarity is ``<e_t, e_v>``.
``as_string_batch``: the raw-input check both preprocessors (text and image) apply.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras


@tf_keras.utils.register_keras_serializable(package="ce_retrieval")
class L2Normalize(tf_keras.layers.Layer):
    """Casts to float32 and L2-normalises along the last axis."""

    def __init__(self, epsilon: float = 1e-12, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def call(self, inputs) -> tf.Tensor:
        x = tf.cast(inputs, tf.float32)
        return tf.math.l2_normalize(x, axis=-1, epsilon=self.epsilon)

    def get_config(self) -> dict:
        return {**super().get_config(), "epsilon": self.epsilon}


def as_string_batch(inputs, layer: str, what: str) -> tf.Tensor:
    """``inputs`` as a rank-1 ``tf.string`` batch [B] (raw input of a tower's preprocessor), or a TypeError /
    ValueError naming ``layer`` and what the strings are."""
    strings = tf.convert_to_tensor(inputs)
    if strings.dtype != tf.string:
        raise TypeError(f"{layer} expects a tf.string batch of {what}, got dtype {strings.dtype.name}")
    if strings.shape.rank is not None and strings.shape.rank != 1:
        raise ValueError(f"{layer} expects a rank-1 batch of {what} [B], got shape {strings.shape}")
    return strings


__all__ = ["L2Normalize", "as_string_batch"]
