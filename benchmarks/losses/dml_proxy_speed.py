"""Forward + backward cost of the proxy / NCA / LMNN / centroid losses at N = 2048, as a ratio to
SampledSoftmax (paper eq. 2) on the in-batch [N, N] matrix, measured in the same process.

    .venv/bin/python -m benchmarks.losses.dml_proxy_speed [--n 2048] [--dim 128] [--classes 512]
        [--repeats 7] [--xla]

Each loss is timed as one tf.function computing the loss from embeddings (and proxies) and the gradients
with respect to both; the baseline does the same for SampledSoftmax on S = E Eᵀ with one positive per row.
Pair-based losses (NCA, LMNN) also work on [N, N]; proxy losses on [N, C·K]. Reported: median seconds of
``--repeats`` runs after a warm-up, and the ratio to the baseline's median.
"""

from __future__ import annotations  # noqa: I001  (ce_retrieval must be imported before TensorFlow)

import argparse
import statistics
import time

import ce_retrieval  # noqa: F401  (legacy Keras before TensorFlow)
import numpy as np
import tensorflow as tf

import ce_retrieval.losses as L
from ce_retrieval.modeling.proxies import proxy_relevance


def _timed(fn, repeats):
    fn()  # trace / compile
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=512, help="proxy classes (and label range of the batch)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--xla", action="store_true", help="jit_compile=True for every function")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    n, dim, c = args.n, args.dim, args.classes
    emb = tf.Variable(rng.normal(size=(n, dim)).astype(np.float32))
    other = tf.Variable(rng.normal(size=(n, dim)).astype(np.float32))  # documents of the two-tower baseline
    labels = tf.constant(rng.integers(0, c, n).astype(np.int32))
    pair_rel = L.relevance_from_ids(labels, labels, exclude_self=True)

    def pair_fn(loss):
        def run():
            with tf.GradientTape() as tape:
                e = tf.math.l2_normalize(emb, -1)
                value = loss(pair_rel, tf.matmul(e, e, transpose_b=True))
            return value, tape.gradient(value, emb)

        return run

    def proxy_fn(loss, k):
        proxies = tf.Variable(rng.normal(size=(c * k, dim)).astype(np.float32))
        rel = proxy_relevance(labels, c, k)

        def run():
            with tf.GradientTape() as tape:
                s = tf.matmul(tf.math.l2_normalize(emb, -1), tf.math.l2_normalize(proxies, -1), transpose_b=True)
                value = loss(rel, s)
            return value, tape.gradient(value, [emb, proxies])

        return run

    baseline, baseline_name = L.SampledSoftmax(), "SampledSoftmax"

    def baseline_fn():
        with tf.GradientTape() as tape:
            q, d = tf.math.l2_normalize(emb, -1), tf.math.l2_normalize(other, -1)
            value = baseline(tf.eye(n), tf.matmul(q, d, transpose_b=True))
        return value, tape.gradient(value, [emb, other])

    cases = [
        (baseline_name, baseline_fn),
        (f"ProxyNCALoss (C={c})", proxy_fn(L.ProxyNCALoss(), 1)),
        (f"ProxyAnchorLoss (C={c})", proxy_fn(L.ProxyAnchorLoss(), 1)),
        (f"SoftTripleLoss (C={c}, K=10)", proxy_fn(L.SoftTripleLoss(proxies_per_class=10), 10)),
        (f"CentroidUpperBoundLoss (C={c})", proxy_fn(L.CentroidUpperBoundLoss(), 1)),
        ("NCALoss ([N, N])", pair_fn(L.NCALoss())),
        ("LMNNLoss k=3 ([N, N])", pair_fn(L.LMNNLoss(k=3))),
    ]
    print(f"N={n} D={dim} classes={c} xla={args.xla} repeats={args.repeats} threads=default")
    print(f"{'loss':<48}{'median s':>10}{'ratio':>8}")
    base = None
    for name, fn in cases:
        seconds = _timed(tf.function(fn, jit_compile=args.xla), args.repeats)
        base = base or seconds
        print(f"{name:<48}{seconds:>10.4f}{seconds / base:>8.2f}")


if __name__ == "__main__":
    main()
