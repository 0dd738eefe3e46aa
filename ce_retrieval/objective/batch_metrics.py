"""What a step logs besides the loss, computed without the ``[N, M]`` matrix when the loss path has none.

* in-batch recall@1: the fraction of query rows whose most similar document (first on ties) is relevant,
  ``mean_i 1[id(argmax_j q_i·d_j) == id_i]``; streamed over column tiles of T documents on the tiled paths;
* has a positive: some query id equals some document id (the loss is undefined without a positive pair), by a
  sorted search, O((N + M) log M).

No gradient flows through either.
"""

from __future__ import annotations

import tensorflow as tf


def recall_at_1_dense(scores: tf.Tensor, relevance: tf.Tensor) -> tf.Tensor:
    """Recall@1 of the rows of a dense ``[N, M]`` score matrix with relevance in {-1, 0, 1}."""
    top1 = tf.argmax(scores, axis=1, output_type=tf.int32)
    hit = tf.gather(relevance, top1, axis=1, batch_dims=1) > 0
    return tf.reduce_mean(tf.cast(hit, tf.float32))


def recall_at_1_tiled(queries, docs, query_ids, doc_ids, tile: int) -> tf.Tensor:
    """Recall@1 of ``queries [N, d]`` against ``docs [M, d]`` by a running max over tiles of ``tile`` columns."""
    queries = tf.stop_gradient(tf.cast(queries, tf.float32))
    docs = tf.stop_gradient(tf.cast(docs, tf.float32))
    num_docs = tf.shape(docs)[0]
    num_tiles = (num_docs + tile - 1) // tile
    padded = tf.pad(docs, [[0, num_tiles * tile - num_docs], [0, 0]])
    tiles = tf.reshape(padded, [-1, tile, tf.shape(docs)[1]])
    n = tf.shape(queries)[0]

    def body(t, best, where):
        scores = tf.matmul(queries, tiles[t], transpose_b=True)
        column = t * tile + tf.range(tile)
        scores = tf.where(column[None, :] < num_docs, scores, float("-inf"))
        peak, arg = tf.reduce_max(scores, axis=1), tf.argmax(scores, axis=1, output_type=tf.int32)
        better = peak > best  # strict: the first maximum wins, as argmax over the whole row
        return t + 1, tf.where(better, peak, best), tf.where(better, t * tile + arg, where)

    _, _, where = tf.while_loop(
        lambda t, *_: t < num_tiles,
        body,
        (tf.constant(0), tf.fill([n], float("-inf")), tf.zeros([n], tf.int32)),
        parallel_iterations=1,
    )
    hit = tf.equal(tf.gather(doc_ids, where), query_ids)
    return tf.reduce_mean(tf.cast(hit, tf.float32))


def has_positive(query_ids, doc_ids) -> tf.Tensor:
    """Whether some query id is among the document ids (bool scalar)."""
    ordered = tf.sort(doc_ids)
    at = tf.minimum(tf.searchsorted(ordered, query_ids), tf.maximum(tf.size(ordered) - 1, 0))
    return tf.reduce_any(tf.equal(tf.gather(ordered, at), query_ids))


__all__ = ["has_positive", "recall_at_1_dense", "recall_at_1_tiled"]
