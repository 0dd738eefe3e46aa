"""Helpers for the modeling tests: a tiny WordPiece vocab and tiny PNG/JPEG batches (the tests train with the
project's SampledSoftmax).

A uniquely named module (not imported as ``conftest``, which in a whole-suite run could be another folder's
conftest); the ``vocab_file`` fixture lives in this folder's conftest.py.
"""

import dataclasses

import numpy as np
import tensorflow as tf

VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "a",
    "the",
    "red",
    "green",
    "blue",
    "yellow",
    "dog",
    "cat",
    "car",
    "tree",
    "on",
    "in",
    "grass",
    "street",
    "small",
    "big",
    "##s",
    "##y",
    "with",
    "sky",
    ".",
]
WORDS = ["red", "green", "blue", "yellow", "dog", "cat", "car", "tree", "grass", "street", "small", "big", "sky"]


def make_images(n, seed=0, size=(40, 48), fmt="png"):
    """n distinct encoded images: random colour blocks (each clearly different)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        blocks = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        img = np.kron(blocks, np.ones((size[0] // 4, size[1] // 4, 1), np.uint8))
        enc = tf.io.encode_png(img) if fmt == "png" else tf.io.encode_jpeg(img, quality=95)
        out.append(enc.numpy())
    return out


def make_batch(num_images=6, captions_per_image=(2, 1, 1, 1, 1, 2), seed=0):
    """A batch dict with one row per caption; images with two captions appear twice (same id, same bytes)."""
    rng = np.random.default_rng(seed)
    images = make_images(num_images, seed)
    caps, imgs, ids = [], [], []
    for i in range(num_images):
        for _ in range(captions_per_image[i]):
            words = rng.choice(WORDS, size=4, replace=False)
            caps.append(f"a {words[0]} {words[1]} on the {words[2]} {words[3]}")
            imgs.append(images[i])
            ids.append(100 + i)
    return {"caption": tf.constant(caps), "image": tf.constant(imgs), "image_id": tf.constant(ids, tf.int64)}


def tiny_config(augment=False, **overrides):
    from ce_retrieval.modeling import ModelConfig

    cfg = ModelConfig.tiny(**overrides)  # made smaller still: tests pay graph-building time per model
    cfg.text = dataclasses.replace(
        cfg.text, hidden_size=32, num_layers=1, intermediate_size=64, dropout_rate=0.0, attention_dropout_rate=0.0
    )
    cfg.image = dataclasses.replace(
        cfg.image, image_size=32, stackwise_filters=[8, 16], stackwise_blocks=[1, 1], stackwise_strides=[1, 2]
    )
    cfg.image.augmentation = dataclasses.replace(cfg.image.augmentation, enabled=augment)
    return cfg


def loss_cosine_relevance(model, batch):
    """(the model's logged loss on ``batch`` without augmentation, its text × image cosines [B, B], relevance [B, B])
    on one replica: what a test compares against a float64 reference."""
    from ce_retrieval.losses import relevance_from_ids

    text_inputs, pixels, ids = model._prepare(batch, augment=False)
    loss = model._global_loss(text_inputs, pixels, ids, False)[0]
    text = model.text_core(text_inputs, training=False)
    image = model.image_core(pixels, training=False)
    return loss, tf.matmul(text, image, transpose_b=True), relevance_from_ids(ids, ids)
