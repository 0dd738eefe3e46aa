"""The global similarity matrix of a distributed batch: gather embeddings across replicas, then cosine.

    S = T_all V_all^T,   T_all = concat_r T_r,  V_all = concat_r V_r   (rows: captions, columns: images)

Every replica gathers all replicas' unit embeddings (``ReplicaContext.all_gather``, in replica order) and builds
the same global ``[N, N]`` matrix, so the loss sees the whole global batch as negatives (as the paper's
Cross-Example Softmax needs), like OpenCLIP's ``gather_with_grad=True, local_loss=False``. ``all_gather`` is
differentiable: its gradient sums the upstream gradients of all replicas for each replica's slice, which with
the train step's ``1 / num_replicas`` scaling and Keras's SUM all-reduce yields exactly d(global loss)/d(theta)
(ce_retrieval/modeling/two_tower.py). Outside a multi-replica strategy it is the identity.
"""

from __future__ import annotations

import tensorflow as tf


def num_replicas() -> int:
    ctx = tf.distribute.get_replica_context()
    return 1 if ctx is None else int(ctx.num_replicas_in_sync)


def gather_from_replicas(x: tf.Tensor) -> tf.Tensor:
    """Concatenates ``x`` of all replicas along axis 0 (identity with one replica or in cross-replica context).

    Differentiable: the gradient of replica r's slice is the SUM over replicas of their upstream gradients for
    that slice (an all-reduce, then this replica's rows). ``ReplicaContext.all_gather``'s own gradient does the
    same, but both collectives use their input tensor's device as the destination, which is unset inside
    ``tf.function`` under ``MultiWorkerMirroredStrategy`` ("destinations can not be empty"); here the tensors
    are placed on this replica's worker device first.
    Per-replica sizes may differ (offsets come from the gathered sizes).
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    device = _replica_device(ctx)

    def _placed(t):
        if not device:
            return t
        with tf.device(device):
            return tf.identity(t)

    @tf.custom_gradient
    def _gather(value):
        gathered = ctx.all_gather(_placed(value), axis=0)
        sizes = ctx.all_gather(_placed(tf.shape(value)[:1]), axis=0)
        replica = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
        start = tf.reduce_sum(sizes[:replica])

        def grad(upstream):
            total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, _placed(upstream))
            return total[start : start + tf.shape(value)[0]]

        return gathered, grad

    return _gather(x)


def _replica_device(ctx) -> str | None:
    """This replica's device when the strategy has one local device per worker (multi-worker CPU/GPU); None
    when replicas are already placed explicitly (MirroredStrategy over several local devices)."""
    devices = tf.distribute.get_strategy().extended.worker_devices
    return devices[0] if len(devices) == 1 else None


def cosine_similarity(text_embeddings: tf.Tensor, image_embeddings: tf.Tensor) -> tf.Tensor:
    """float32 ``[N, M]`` inner products of unit embeddings (cosine similarity)."""
    t = tf.cast(text_embeddings, tf.float32)
    v = tf.cast(image_embeddings, tf.float32)
    return tf.matmul(t, v, transpose_b=True)


__all__ = ["cosine_similarity", "gather_from_replicas", "num_replicas"]
