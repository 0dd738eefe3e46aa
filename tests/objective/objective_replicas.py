"""Run as a subprocess by test_objective_replicas.py: the objective under MirroredStrategy on R logical CPUs vs one
device. Usage: ``python objective_replicas.py R``; prints one JSON line of relative differences.

For every registered loss, the replicated dense path: Σ_r (share_r) = L and the replicas' embedding gradients
(through all_gather) = the one-device gradients of L. For the softmax family also tiled, sharded and
sharded + tiled (T = 3, bidirectional and learned λ included), and for SigLIP the same paths with learned t and b,
in a graph.
Logical devices must be configured before TensorFlow runs any op, hence a fresh process.
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
REPLICAS = int(sys.argv[1]) if len(sys.argv) > 1 else 2

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)

from ce_retrieval import losses  # noqa: E402
from ce_retrieval.configs.experiment import LossConfig  # noqa: E402
from ce_retrieval.modeling.config import ModelConfig  # noqa: E402
from ce_retrieval.objective import LogitBias, LogitScale, RetrievalObjective  # noqa: E402
from ce_retrieval.tasks import build_loss  # noqa: E402

ROWS = 8
IDS = np.array([0, 0, 1, 2, 3, 4, 5, 5], np.int64)  # duplicate ids inside and across replicas


def unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


rng = np.random.default_rng(0)
TEXT, IMAGE = unit(rng.normal(size=(ROWS, 6))), unit(rng.normal(size=(ROWS, 6)))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def one_device(objective, scale):
    text, image = tf.constant(TEXT), tf.constant(IMAGE)
    with tf.GradientTape() as tape:
        tape.watch([text, image])
        value = objective(text, image, tf.constant(IDS)).share
    grads = tape.gradient(value, [text, image, *scale.trainable_variables])
    return float(value), [np.zeros_like(TEXT) if g is None else g.numpy() for g in grads]


def replicas(strategy, make):
    with strategy.scope():
        objective, scale = make()
    split = ROWS // REPLICAS

    def rows(array):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(
                array[ctx.replica_id_in_sync_group * split : (ctx.replica_id_in_sync_group + 1) * split]
            )
        )

    @tf.function
    def step(text, image, ids):
        def fn(t, v, i):
            with tf.GradientTape() as tape:
                tape.watch([t, v])
                share = objective(t, v, i).share
            grads = tape.gradient(share, [t, v, *scale.trainable_variables])
            return share, [tf.zeros_like(t) if g is None else g for g in grads]

        return strategy.run(fn, args=(text, image, ids))

    shares, grads = step(rows(TEXT), rows(IMAGE), rows(IDS))
    local = lambda x: [t.numpy() for t in strategy.experimental_local_results(x)]  # noqa: E731
    total = float(np.sum(local(shares)))
    out = [np.concatenate(local(grads[0])), np.concatenate(local(grads[1]))]
    out += [np.sum(local(g), axis=0) for g in grads[2:]]  # a variable's gradient: summed over replicas by Keras
    return total, out


def compare(strategy, make):
    objective, scale = make()
    want, want_grads = one_device(objective, scale)
    got, got_grads = replicas(strategy, make)
    return {"value": rel(got, want), "grads": max(rel(g, w) for g, w in zip(got_grads, want_grads, strict=True))}


def main():
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    results = {}
    for name in losses.available():
        bias = -10.0 if losses.lookup(name).has_logit_bias else None  # SigLIP: b is the objective's, like λ
        loss = build_loss(LossConfig(name=name), ModelConfig(logit_bias=bias))
        results[f"{name}/replicated"] = compare(
            strategy, lambda loss=loss, bias=bias: (RetrievalObjective(loss, logit_bias=bias), LogitScale())
        )
    family = [  # the softmax losses with every path (MixedSoftmax is dense only, covered above)
        n
        for n in losses.available()
        if issubclass(losses.lookup(n), losses.SoftmaxFamilyLoss)
        and losses.lookup(n).supports_tiled
        and losses.lookup(n).supports_sharded
    ]
    for name in family:
        for partition, tile, bidirectional, learn in [
            ("replicated", 3, False, False),
            ("sharded", 0, True, True),
            ("sharded", 3, True, True),
        ]:
            kwargs = {"bidirectional": bidirectional}
            loss = build_loss(LossConfig(name=name, kwargs=kwargs), ModelConfig(learn_logit_scale=learn))

            def make(loss=loss, partition=partition, tile=tile, learn=learn):
                scale = LogitScale(20.0, learn=learn)
                return RetrievalObjective(loss, scale, partition=partition, tile_size=tile), scale

            results[f"{name}/{partition}/tile{tile}/bi{int(bidirectional)}/learn{int(learn)}"] = compare(strategy, make)
    learned = ModelConfig(logit_scale=10.0, learn_logit_scale=True, logit_bias=-10.0, learn_logit_bias=True)
    siglip = build_loss(LossConfig(name="SigmoidLoss"), learned)
    for partition, tile in [("replicated", 3), ("sharded", 0), ("sharded", 3)]:

        def make(partition=partition, tile=tile):
            scale, bias = LogitScale(10.0, learn=True), LogitBias(-10.0, learn=True)
            objective = RetrievalObjective(siglip, scale, partition=partition, tile_size=tile, logit_bias=bias)
            return objective, objective  # its trainable_variables: t' and b

        results[f"SigmoidLoss/{partition}/tile{tile}/learn1"] = compare(strategy, make)
    print(json.dumps({"replicas": REPLICAS, "results": results}))


if __name__ == "__main__":
    main()
