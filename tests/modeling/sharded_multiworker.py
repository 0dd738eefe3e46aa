"""Run by test_sharded_loss.py as two processes: the sharded cross-example loss (CE and CENM) under
``MultiWorkerMirroredStrategy`` with 2 workers on 127.0.0.1 (one CPU replica each) vs the dense loss on one device.

Usage: ``python sharded_multiworker.py INDEX PORT0,PORT1``. Prints one JSON line: relative differences of the
summed shares and of this worker's gradients (its rows of dL/dT and dL/dV) from the dense ones.
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
INDEX, PORTS = int(sys.argv[1]), sys.argv[2].split(",")
os.environ["TF_CONFIG"] = json.dumps(
    {"cluster": {"worker": [f"127.0.0.1:{p}" for p in PORTS]}, "task": {"type": "worker", "index": INDEX}}
)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from ce_retrieval.losses import relevance_from_ids  # noqa: E402
from ce_retrieval.losses.kernels.sharded import sharded_softmax_loss  # noqa: E402
from ce_retrieval.losses.kernels.softmax import softmax_loss  # noqa: E402
from ce_retrieval.modeling import gather_from_replicas  # noqa: E402
from ce_retrieval.utils.replicas import replica_sum  # noqa: E402

IDS = np.array([0, 0, 1, 2, 3, 3, 4, 5], np.int64)  # two positives per row, inside and across workers


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def scores(t, v):
    return tf.matmul(tf.math.l2_normalize(t, -1), tf.math.l2_normalize(v, -1), transpose_b=True)


def main():
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    replicas = strategy.num_replicas_in_sync
    rng = np.random.default_rng(0)
    x_t, x_v = rng.normal(size=(8, 6)).astype(np.float32), rng.normal(size=(8, 6)).astype(np.float32)
    rows = slice(INDEX * 8 // replicas, (INDEX + 1) * 8 // replicas)
    out = {"worker": INDEX, "replicas": replicas}
    for name, fraction in (("CrossExampleSoftmax", None), ("CrossExampleNegativeMining", 0.5)):
        t, v = tf.constant(x_t), tf.constant(x_v)
        with tf.GradientTape() as tape:
            tape.watch([t, v])
            dense = softmax_loss(relevance_from_ids(IDS, IDS), scores(t, v), 20.0, True, fraction)
        grad_t, grad_v = tape.gradient(dense, [t, v])

        @tf.function
        def step(t_r, v_r, ids_r, fraction=fraction):
            def fn(t_r, v_r, ids_r):
                with tf.GradientTape() as tape:
                    tape.watch([t_r, v_r])
                    v_all = gather_from_replicas(tf.math.l2_normalize(v_r, -1))
                    relevance = relevance_from_ids(ids_r, gather_from_replicas(ids_r))
                    s = tf.matmul(tf.math.l2_normalize(t_r, -1), v_all, transpose_b=True)
                    share = sharded_softmax_loss(relevance, s, 20.0, True, fraction)
                return (replica_sum(share), *tape.gradient(share, [t_r, v_r]))

            return strategy.run(fn, args=(t_r, v_r, ids_r))

        total, g_t, g_v = step(tf.constant(x_t[rows]), tf.constant(x_v[rows]), tf.constant(IDS[rows]))
        out[name] = {
            "value": rel(float(total), float(dense)),
            "grad_t": rel(g_t.numpy(), grad_t.numpy()[rows]),
            "grad_v": rel(g_v.numpy(), grad_v.numpy()[rows]),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
