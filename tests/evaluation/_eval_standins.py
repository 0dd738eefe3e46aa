"""Tiny stand-ins for the real towers and data (the interfaces of ce_retrieval.modeling / ce_retrieval.data).

Images are 16x16 PNGs of one of eight colours (with noise); captions name the colour in a few phrasings. A
text tower (hashed words -> mean embedding -> dense -> L2) and an image tower (decode -> mean colour ->
dense -> L2) learn to match them in a few epochs.
"""

import numpy as np
import tensorflow as tf
import tf_keras

from ce_retrieval.data.schema import RetrievalSplit

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 200, 40),
    "blue": (30, 40, 220),
    "yellow": (230, 220, 30),
    "purple": (140, 30, 180),
    "orange": (250, 140, 20),
    "black": (15, 15, 15),
    "white": (240, 240, 240),
}
PHRASES = ["a {} square", "something {}", "the colour {}", "{} picture"]


def png(rgb, rng, size=16):
    pixels = np.clip(np.asarray(rgb)[None, None, :] + rng.normal(0, 12, (size, size, 3)), 0, 255).astype(np.uint8)
    return tf.io.encode_png(pixels).numpy()


def make_split(num_images=16, captions_per_image=2, seed=0, name="test") -> RetrievalSplit:
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    images, image_ids, captions, caption_ids = [], [], [], []
    for i in range(num_images):
        colour = names[i % len(names)]
        images.append(png(COLOURS[colour], rng))
        image_ids.append(1000 + i)
        for c in range(captions_per_image):
            captions.append(PHRASES[(i + c) % len(PHRASES)].format(colour))
            caption_ids.append(1000 + i)
    return RetrievalSplit(captions, np.array(caption_ids), images, np.array(image_ids), name=name)


class TextStandIn(tf_keras.Model):
    def __init__(self, dim=8, buckets=512):
        super().__init__()
        self.buckets = buckets
        self.table = self.add_weight(name="table", shape=(buckets, 16), initializer="random_normal")
        self.proj = tf_keras.layers.Dense(dim, use_bias=False)

    def call(self, captions, training=False):
        words = tf.strings.split(tf.strings.lower(captions))
        ids = tf.strings.to_hash_bucket_fast(words, self.buckets).to_tensor(default_value=-1)
        mask = tf.cast(ids >= 0, tf.float32)[..., None]
        vectors = tf.gather(self.table, tf.maximum(ids, 0)) * mask
        mean = tf.reduce_sum(vectors, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)
        return tf.math.l2_normalize(self.proj(mean), axis=-1)


class ImageStandIn(tf_keras.Model):
    def __init__(self, dim=8):
        super().__init__()
        self.hidden = tf_keras.layers.Dense(16, activation="relu")
        self.proj = tf_keras.layers.Dense(dim, use_bias=False)

    def call(self, images, training=False):
        pixels = tf.map_fn(
            lambda b: tf.image.resize(tf.io.decode_png(b, channels=3), [8, 8]) / 255.0,
            images,
            fn_output_signature=tf.TensorSpec([8, 8, 3], tf.float32),
        )
        return tf.math.l2_normalize(self.proj(self.hidden(tf.reduce_mean(pixels, [1, 2]))), axis=-1)


class TwoTowerStandIn(tf_keras.Model):
    """In-batch softmax over both directions (targets spread over captions of the same image)."""

    def __init__(self, dim=8):
        super().__init__()
        self.text_encoder = TextStandIn(dim)
        self.image_encoder = ImageStandIn(dim)

    def call(self, batch, training=False):
        return {
            "text": self.text_encoder(batch["caption"], training=training),
            "image": self.image_encoder(batch["image"], training=training),
        }

    def train_step(self, batch):
        with tf.GradientTape() as tape:
            out = self(batch, training=True)
            logits = 10.0 * tf.matmul(out["text"], out["image"], transpose_b=True)
            same = tf.cast(tf.equal(batch["image_id"][:, None], batch["image_id"][None, :]), tf.float32)
            target = same / tf.reduce_sum(same, 1, keepdims=True)
            loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(target, logits))
            loss += tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(tf.transpose(target), tf.transpose(logits)))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        return {"loss": loss}


def train_dataset(split, batch_size=8, seed=0):
    index = {i: b for i, b in zip(split.image_ids.tolist(), split.images, strict=True)}
    data = {
        "caption": tf.constant(split.captions),
        "image": tf.constant([index[i] for i in split.caption_ids.tolist()]),
        "image_id": tf.constant(split.caption_ids),
    }
    return tf.data.Dataset.from_tensor_slices(data).shuffle(64, seed=seed).batch(batch_size, drop_remainder=True)
