"""Cross-replica collectives shared by the losses, the objective and the model: one floor below all three.

    gather_from_replicas(x) = concat_r x_r          (in replica order; differentiable: SUM of upstreams)
    replica_sum(x)          = Σ_r x_r               (differentiable: every replica gets the upstream sum)

Every replica of a ``tf.distribute`` strategy calls them with its own ``x_r``; outside a replica context, or with
one replica, both are the identity. The gradient of ``gather_from_replicas`` sums the upstream gradients of all
replicas for each replica's slice, which with a step that differentiates ``L / R`` (or a replica's share of L)
and Keras's SUM all-reduce of variable gradients gives exactly ``dL/dθ``. ``losses/`` (the sharded and tiled
paths), ``objective/`` and ``modeling/`` import them from here, so no package imports from a floor above it.
"""

from __future__ import annotations

import tensorflow as tf


def num_replicas() -> int:
    """R, the replicas of the current replica context (1 outside one)."""
    ctx = tf.distribute.get_replica_context()
    return 1 if ctx is None else int(ctx.num_replicas_in_sync)


def gather_from_replicas(x: tf.Tensor, offset=None) -> tf.Tensor:
    """Concatenates ``x`` of all replicas along axis 0 (identity with one replica or in cross-replica context).

    Differentiable: the gradient of replica r's slice is the SUM over replicas of their upstream gradients for
    that slice (an all-reduce, then this replica's rows). ``ReplicaContext.all_gather``'s own gradient does the
    same, but both collectives use their input tensor's device as the destination, which is unset inside
    ``tf.function`` under ``MultiWorkerMirroredStrategy`` ("destinations can not be empty"); here the tensors
    are placed on this replica's worker device first.
    Per-replica sizes may differ: ``offset``, this replica's first row in the result, is :func:`replica_offset`
    of ``x`` (one more collective) unless given (e.g. once for several tensors with the same rows). An integer
    ``x`` (ids) has no gradient and needs no offset: one collective.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    if not tf.as_dtype(x.dtype).is_floating:  # ids and counts: no gradient, so no offset (one collective, not two)
        return ctx.all_gather(_placed(ctx, x), axis=0)

    @tf.custom_gradient
    def _gather(value):
        gathered = ctx.all_gather(_placed(ctx, value), axis=0)
        start = replica_offset(value) if offset is None else offset

        def grad(upstream):
            total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, _placed(ctx, upstream))
            return total[start : start + tf.shape(value)[0]]

        return gathered, grad

    return _gather(x)


def replica_offset(x: tf.Tensor) -> tf.Tensor:
    """This replica's first row in ``gather_from_replicas(x)``: the rows of the replicas before it (0 outside a
    replica context or with one replica)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return tf.constant(0, tf.int32)
    replica = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
    return tf.reduce_sum(ctx.all_gather(_placed(ctx, tf.shape(x)[:1]), axis=0)[:replica])


def stack_from_replicas(x: tf.Tensor) -> tf.Tensor:
    """``x`` of every replica stacked on a new axis 0 (``[R, ...]``); differentiable (SUM of upstreams)."""
    ctx = tf.distribute.get_replica_context()
    replica = 0 if ctx is None else tf.cast(ctx.replica_id_in_sync_group, tf.int32)
    return gather_from_replicas(x[None], offset=replica)  # one row per replica


def replica_sum(x: tf.Tensor) -> tf.Tensor:
    """Σ_r x_r over the replicas (x itself outside a replica context); differentiable."""
    return tf.reduce_sum(stack_from_replicas(x), axis=0)


def _placed(ctx, t: tf.Tensor) -> tf.Tensor:
    """``t`` on this replica's worker device where the strategy needs it placed (``_replica_device``)."""
    device = _replica_device(ctx)
    if not device:
        return t
    with tf.device(device):
        return tf.identity(t)


def _replica_device(ctx) -> str | None:
    """This replica's device when the strategy has one local device per worker (multi-worker CPU/GPU); None
    when replicas are already placed explicitly (MirroredStrategy over several local devices)."""
    devices = tf.distribute.get_strategy().extended.worker_devices
    return devices[0] if len(devices) == 1 else None


__all__ = ["gather_from_replicas", "num_replicas", "replica_offset", "replica_sum", "stack_from_replicas"]
