"""Stand-in exports for the serving benchmarks: two tiny towers exported as a real export folder in seconds, where a
benchmark measures the index, the search or the service rather than the model.

The text tower embeds a caption as the normalised sum of hashed-word embeddings (bag of words), the image tower
projects an 8 x 8 thumbnail; both are untrained (their weights come from the Keras seed in force).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf_keras

from ce_retrieval.build.export import export_encoders


class HashedTextTower(tf_keras.Model):
    """Caption -> L2-normalised sum of the embeddings of its lower-cased words, hashed into ``buckets``."""

    def __init__(self, dim=128, buckets=4096):
        super().__init__()
        self.buckets = buckets
        self.table = tf_keras.layers.Embedding(buckets, dim)

    def call(self, texts, training=False):
        ids = tf.strings.to_hash_bucket_fast(tf.strings.split(tf.strings.lower(texts)), self.buckets)
        return tf.math.l2_normalize(tf.reduce_sum(tf.ragged.map_flat_values(self.table, ids), axis=1), axis=-1)


class TinyImageTower(tf_keras.Model):
    """Encoded image -> L2-normalised linear projection of its 8 x 8 RGB thumbnail."""

    def __init__(self, dim=128):
        super().__init__()
        self.proj = tf_keras.layers.Dense(dim)

    def call(self, image_bytes, training=False):
        imgs = tf.map_fn(
            lambda b: tf.image.resize(tf.cast(tf.io.decode_image(b, 3, expand_animations=False), tf.float32), (8, 8)),
            image_bytes,
            fn_output_signature=tf.TensorSpec([8, 8, 3], tf.float32),
        )
        return tf.math.l2_normalize(self.proj(tf.reshape(imgs, [-1, 192])), axis=-1)


def stand_in_export(root: str, dim: int = 128) -> tuple[HashedTextTower, TinyImageTower]:
    """Builds both towers (``dim`` dimensions), exports them to ``root`` (logit scale 20) and returns them (a
    benchmark embeds its queries with the text tower)."""
    text, image = HashedTextTower(dim=dim), TinyImageTower(dim=dim)
    text(tf.constant(["x"]))
    image(tf.constant([tf.io.encode_png(np.zeros((8, 8, 3), np.uint8)).numpy()]))
    export_encoders(text, image, root, logit_scale=20.0)
    return text, image


__all__ = ["HashedTextTower", "TinyImageTower", "stand_in_export"]
