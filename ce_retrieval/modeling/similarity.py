"""The global similarity matrix of a distributed batch: gather embeddings across replicas, then cosine.

    S = T_all V_all^T,   T_all = concat_r T_r,  V_all = concat_r V_r   (rows: captions, columns: images)

Every replica gathers all replicas' unit embeddings (``ReplicaContext.all_gather``, in replica order) and builds
the same global ``[N, N]`` matrix, so the loss sees the whole global batch as negatives (as the paper's
Cross-Example Softmax needs), like OpenCLIP's ``gather_with_grad=True, local_loss=False``. ``all_gather`` is
differentiable: its gradient sums the upstream gradients of all replicas for each replica's slice, which with
the train step's ``1 / num_replicas`` scaling and Keras's SUM all-reduce yields exactly d(global loss)/d(theta)
(ce_retrieval/modeling/two_tower.py). Outside a multi-replica strategy it is the identity. The collectives live in
:mod:`ce_retrieval.utils.replicas` (the losses' sharded and tiled paths use them too) and are re-exported here.
"""

from __future__ import annotations

import tensorflow as tf

from ce_retrieval.utils.replicas import gather_from_replicas, num_replicas


def cosine_similarity(text_embeddings: tf.Tensor, image_embeddings: tf.Tensor) -> tf.Tensor:
    """float32 ``[N, M]`` inner products of unit embeddings (cosine similarity)."""
    t = tf.cast(text_embeddings, tf.float32)
    v = tf.cast(image_embeddings, tf.float32)
    return tf.matmul(t, v, transpose_b=True)


__all__ = ["cosine_similarity", "gather_from_replicas", "num_replicas"]
