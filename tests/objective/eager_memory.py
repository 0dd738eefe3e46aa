"""Run as a subprocess by test_eager_memory.py: peak RSS growth of one eager ``GradientTape`` step of
``CrossExampleSoftmax(tile_size=512).from_embeddings`` (or, with ``siglip``, ``SigmoidLoss().tiled_loss`` with
T = 512) at N queries x N documents (d = 8).
Usage: ``python eager_memory.py N [siglip]``; prints ``{"growth_gib": ..., "value": ...}``."""

import json
import resource
import sys

import tensorflow as tf

from ce_retrieval.losses import CrossExampleSoftmax, SigmoidLoss


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def step(loss, q, d, ids):
    with tf.GradientTape() as tape:
        tape.watch([q, d])
        if isinstance(loss, SigmoidLoss):
            value = loss.tiled_loss(q, d, ids, ids, tile_size=512)
        else:
            value = loss.from_embeddings(q, d, ids, ids)
    grads = tape.gradient(value, [q, d])
    return float(value), [g.numpy() for g in grads]


def main(n: int, which: str) -> None:
    q = tf.math.l2_normalize(tf.random.stateless_normal([n, 8], [1, 2]), -1)
    d = tf.math.l2_normalize(tf.random.stateless_normal([n, 8], [3, 4]), -1)
    ids = tf.range(n, dtype=tf.int64)
    loss = SigmoidLoss() if which == "siglip" else CrossExampleSoftmax(tile_size=512)
    step(loss, q[:512], d[:512], ids[:512])  # warm-up: kernels and allocator pools
    before = peak_gib()
    value, _ = step(loss, q, d, ids)
    print(json.dumps({"growth_gib": peak_gib() - before, "value": value}))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "softmax")
