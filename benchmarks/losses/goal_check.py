"""GOAL check: speed of GradientObjective against an in-batch softmax, and all 15 combinations under model.fit.

Speed: forward + backward on a similarity matrix S = X Y^T of N = 2048 L2-normalised pairs (D = 256), as a
ratio to a local in-batch (sampled) softmax, -log(e^{l_ii} / Sum_{j: R_ij != -1} e^{l_ij}) with l = 20 S,
timed in the same process, interleaved, median of repeats, in graph mode and under XLA. The baseline goes
through the same RetrievalLoss validation as GradientObjective (and SampledSoftmax); its bare version is
listed too. The gradient is
taken with respect to the features (so the two S-matmul backward products, common to both, are included)
and, separately, with respect to S alone (the objective only).

Training: every one of the 15 (triplet weight, pair weight) combinations fitted for a few steps on a tiny two-
tower model with ``model.fit(jit_compile=True)``, in float32 and in mixed_float16; reports the logged value.

    .venv/bin/python -m benchmarks.losses.goal_check [--n 2048] [--repeats 7] [--skip-train]
"""

import argparse
import itertools
import os
import statistics
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # keras-cv needs it, before TensorFlow loads
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # XLA's "Ignoring Assert" lines would flood the table

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from ce_retrieval.losses import GradientObjective, RetrievalLoss  # noqa: E402
from ce_retrieval.losses.goal import PAIR_WEIGHTS, TRIPLET_WEIGHTS  # noqa: E402
from ce_retrieval.utils.seeding import seed_everything  # noqa: E402


def in_batch_softmax(relevance, scores, scale=20.0):
    """Baseline: sampled softmax over the row's non-ignored entries, mean over the diagonal positives."""
    logits = tf.where(relevance < 0, -1e9, scale * scores)
    return tf.reduce_mean(tf.reduce_logsumexp(logits, axis=1) - scale * tf.linalg.diag_part(scores))


class InBatchSoftmax(RetrievalLoss):
    """The same baseline behind the shared loss contract (input validation, float32, replica scaling), as
    every ce_retrieval loss (SampledSoftmax included) and GradientObjective pay it."""

    def compute(self, relevance, scores):
        return in_batch_softmax(relevance, scores)


def _step(loss_fn, wrt):
    def step(x, y, r):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            s = tf.matmul(x, y, transpose_b=True)
            if wrt == "S":
                tape.watch(s)
            value = loss_fn(r, s)
        grads = tape.gradient(value, [s] if wrt == "S" else [x, y])
        return value, grads

    return step


def time_ratio(n, dim, repeats, jit, wrt, combos):
    rng = np.random.default_rng(0)
    x = tf.math.l2_normalize(tf.constant(rng.normal(size=(n, dim)), tf.float32), axis=1)
    y = tf.math.l2_normalize(x + 0.8 * tf.constant(rng.normal(size=(n, dim)), tf.float32), axis=1)
    r = tf.eye(n)
    fns = {
        "softmax": tf.function(_step(InBatchSoftmax(), wrt), jit_compile=jit),
        "softmax, no validation": tf.function(_step(in_batch_softmax, wrt), jit_compile=jit),
    }
    for tw, pw in combos:
        fns[f"{tw} x {pw}"] = tf.function(_step(GradientObjective(tw, pw), wrt), jit_compile=jit)
    times = {k: [] for k in fns}
    for fn in fns.values():  # trace and compile
        fn(x, y, r)
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            out = fn(x, y, r)
            float(out[0])
            _ = [g.numpy() for g in out[1]]
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["softmax"])
    return {k: (statistics.median(v), statistics.median(v) / base) for k, v in times.items()}


def train_all(policy):
    tf_keras.mixed_precision.set_global_policy(policy)
    rng = np.random.default_rng(1)
    z = rng.normal(size=(64, 4))
    images = (z @ rng.normal(size=(4, 6))).astype("float32")
    texts = (z @ rng.normal(size=(4, 5))).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((images, texts)).batch(16, drop_remainder=True)
    ds = ds.map(lambda a, b: ((a, b), tf.eye(16)))
    results = {}
    for tw, pw in itertools.product(TRIPLET_WEIGHTS, PAIR_WEIGHTS):
        tf_keras.backend.clear_session()
        seed_everything(0, deterministic=False)  # every combination starts from the same weights
        a, b = tf_keras.Input((6,)), tf_keras.Input((5,))
        norm = tf_keras.layers.Lambda(lambda t: tf.math.l2_normalize(t, axis=1))
        xa, yb = norm(tf_keras.layers.Dense(4)(a)), norm(tf_keras.layers.Dense(4)(b))
        s = tf_keras.layers.Lambda(lambda t: tf.matmul(t[0], t[1], transpose_b=True))([yb, xa])  # rows texts
        model = tf_keras.Model([a, b], s)
        model.compile(tf_keras.optimizers.SGD(0.3), loss=GradientObjective(tw, pw), jit_compile=True)
        before = [v.numpy().copy() for v in model.trainable_variables]
        hist = model.fit(ds, epochs=2, verbose=0).history["loss"]
        moved = all(not np.allclose(b0, v.numpy()) for b0, v in zip(before, model.trainable_variables, strict=True))
        results[(tw, pw)] = (hist, moved and bool(np.isfinite(hist).all()))
    tf_keras.mixed_precision.set_global_policy("float32")
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--all-combos", action="store_true", help="time all 15 combinations, not 3")
    parser.add_argument("--skip-train", action="store_true")
    args = parser.parse_args()
    combos = (
        list(itertools.product(TRIPLET_WEIGHTS, PAIR_WEIGHTS))
        if args.all_combos
        else [("constant", "constant"), ("circle", "sigmoid"), ("circle", "sigmoid-ms")]
    )
    print(f"N={args.n} D={args.dim}, median of {args.repeats}, ratio to in-batch softmax in the same process")
    for jit in (False, True):
        for wrt in ("S", "features"):
            res = time_ratio(args.n, args.dim, args.repeats, jit, wrt, combos)
            print(f"\n| {'XLA' if jit else 'graph'}, grad wrt {wrt} | ms | ratio |\n|---|---|---|")
            for name, (sec, ratio) in res.items():
                print(f"| {name} | {1e3 * sec:.1f} | {ratio:.2f} |")
    if not args.skip_train:
        for policy in ("float32", "mixed_float16"):
            res = train_all(policy)
            ok = sum(v[1] for v in res.values())
            print(f"\nmodel.fit(jit_compile=True), {policy}: {ok}/15 combinations trained (finite, weights moved)")
            for (tw, pw), (hist, good) in res.items():
                print(f"  {tw:8s} x {pw:10s} goal_value {hist[0]:+.3f} -> {hist[-1]:+.3f} {'ok' if good else 'FAIL'}")


if __name__ == "__main__":
    main()
