"""Forward + backward cost of each pair/triplet loss at N = 2048, as a ratio to an in-batch sampled softmax
computed the same way in the same process (the target: <= 3x, triplet 'all' excepted).

    .venv/bin/python -m benchmarks.losses.dml_pairs_check [--n 2048] [--dim 128] [--per-class 2]
        [--repeats 7] [--xla] [--only Triplet]

Each loss gets a ``tf.function`` (optionally ``jit_compile``) computing ``d loss / d S`` for a fixed
``S = E E^T`` of L2-normalised random embeddings with K examples per class (default K = 2: P x K = 1024 x 2); the figure
is the median wall time over ``repeats`` runs after one warm-up, divided by the baseline's median, the two
run alternately. Ratios
from one process are robust to a loaded machine; absolute times are not.
"""

import argparse
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # keras-cv needs it, before TensorFlow loads
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from ce_retrieval import losses  # noqa: E402


def sampled_softmax(relevance, scores, scale=20.0):
    """Baseline, paper eq. (2): -log(e^{l_ij} / (e^{l_ij} + sum_{Neg_i} e^{l_ik})), mean over positive pairs."""
    logits = scale * scores
    neg = tf.where(relevance == 0.0, logits, tf.fill(tf.shape(logits), -1e9))
    neg_lse = tf.reduce_logsumexp(neg, axis=1, keepdims=True)
    per_pair = tf.nn.softplus(neg_lse - logits)  # log(1 + e^{neg_lse - l_ij})
    positive = tf.cast(relevance == 1.0, tf.float32)
    return tf.reduce_sum(per_pair * positive) / tf.reduce_sum(positive)


CONFIGS = {
    "ContrastiveLoss": lambda: losses.ContrastiveLoss(),
    "TripletLoss(all)": lambda: losses.TripletLoss(),
    "TripletLoss(hard)": lambda: losses.TripletLoss(mining="hard"),
    "TripletLoss(semi-hard)": lambda: losses.TripletLoss(mining="semi-hard"),
    "TripletLoss(batch-hard)": lambda: losses.TripletLoss(mining="hard", positive_mining="hard"),
    "TripletLoss(semi-hard, hardest positive)": lambda: losses.TripletLoss(mining="semi-hard", positive_mining="hard"),
    "LiftedStructureLoss": lambda: losses.LiftedStructureLoss(),
    "NPairLoss": lambda: losses.NPairLoss(),
    "InfoNCE": lambda: losses.InfoNCE(),
    "SymmetricInfoNCE": lambda: losses.SymmetricInfoNCE(),
    "AngularLoss": lambda: losses.AngularLoss(),
    "AngularLoss(+npair)": lambda: losses.AngularLoss(with_npair=True),
    "MultiSimilarityLoss": lambda: losses.MultiSimilarityLoss(),
    "CircleLoss": lambda: losses.CircleLoss(),
    "BinomialDevianceLoss": lambda: losses.BinomialDevianceLoss(),
}


def timed_against(fn, baseline, scores, repeats):
    """Median times of ``fn`` and ``baseline``, run alternately (so load drift hits both alike)."""
    fn(scores).numpy()  # trace / compile + warm-up
    baseline(scores).numpy()
    times, base_times = [], []
    for _ in range(repeats):
        for f, out in ((baseline, base_times), (fn, times)):
            start = time.perf_counter()
            f(scores).numpy()
            out.append(time.perf_counter() - start)
    return float(np.median(times)), float(np.median(base_times))


def grad_fn(loss_fn, relevance, xla):
    def run(scores):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            value = loss_fn(relevance, scores)
        return tf.reduce_sum(tape.gradient(value, scores)) + value

    return tf.function(run, jit_compile=xla, autograph=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--per-class", type=int, default=2, help="K of the P x K batch (K - 1 positives per row)")
    parser.add_argument("--xla", action="store_true", help="jit_compile every function (baseline included)")
    parser.add_argument("--only", default="", help="comma-separated substrings: benchmark matching losses only")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    e = rng.normal(size=(args.n, args.dim)).astype(np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    ids = np.arange(args.n) // args.per_class
    relevance = losses.relevance_from_ids(ids, ids, exclude_self=True)
    scores = tf.constant(e @ e.T)
    baseline = grad_fn(sampled_softmax, relevance, args.xla)
    print(
        f"N={args.n} dim={args.dim} K={args.per_class} xla={args.xla}  baseline: in-batch sampled softmax, "
        "timed alternately with each loss"
    )
    print(f"{'loss':42s} {'ms':>9s} {'base ms':>9s} {'ratio':>7s}")
    for name, factory in CONFIGS.items():
        if args.only and not any(key in name for key in args.only.split(",")):
            continue
        t, base = timed_against(grad_fn(factory(), relevance, args.xla), baseline, scores, args.repeats)
        print(f"{name:42s} {1e3 * t:9.1f} {1e3 * base:9.1f} {t / base:7.2f}")


if __name__ == "__main__":
    main()
