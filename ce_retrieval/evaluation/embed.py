"""Embed a retrieval split with the two towers: captions -> queries, unique images -> documents.

Each tower is a ``tf_keras.Model`` mapping a ``[B]`` batch of raw ``tf.string`` (UTF-8 captions / encoded image
bytes) to ``[B, d]`` embeddings; it runs in inference mode (``training=False``) inside one traced
``tf.function`` per tower and call, in batches of ``batch_size``, and the result is float32 NumPy.
"""

from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

__all__ = ["embed_split", "embed_strings"]


def embed_strings(encoder, items, batch_size: int = 256) -> np.ndarray:
    """``[len(items), d]`` float32 embeddings of strings/bytes by ``encoder`` in batches of ``batch_size``."""
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    items = list(items)
    if not items:
        raise ValueError("embed_strings: nothing to embed (empty list)")

    run = _traced(encoder)
    parts = []
    for start in range(0, len(items), int(batch_size)):
        out = run(tf.constant(items[start : start + int(batch_size)], dtype=tf.string))
        if out.shape.rank != 2 or out.shape[0] != len(items[start : start + int(batch_size)]):
            raise ValueError(f"encoder must return [batch, dim] embeddings, got shape {out.shape}")
        parts.append(out.numpy())
    return np.concatenate(parts, axis=0)


_TRACED = weakref.WeakKeyDictionary()


def _traced(encoder):
    """One traced inference function per encoder, reused across calls (a new ``tf.function`` per call would
    re-trace the whole tower every time the split is embedded, e.g. at every validation epoch)."""
    try:
        return _TRACED[encoder]
    except (KeyError, TypeError):
        pass

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], reduce_retracing=True)
    def run(batch):
        return tf.cast(encoder(batch, training=False), tf.float32)

    try:
        _TRACED[encoder] = run
    except TypeError:  # not weak-referenceable: trace per call
        pass
    return run


def embed_split(
    text_encoder, image_encoder, split, batch_size: int = 256
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(query_emb [N, d], doc_emb [M, d], query_ids [N], doc_ids [M])`` for a :class:`RetrievalSplit`."""
    query_emb = embed_strings(text_encoder, split.captions, batch_size)
    doc_emb = embed_strings(image_encoder, split.images, batch_size)
    if query_emb.shape[1] != doc_emb.shape[1]:
        raise ValueError(f"text embeddings have dimension {query_emb.shape[1]}, image embeddings {doc_emb.shape[1]}")
    return query_emb, doc_emb, np.asarray(split.caption_ids), np.asarray(split.image_ids)
