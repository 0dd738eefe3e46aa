"""Run as a subprocess by test_sharded_loss.py: the sharded softmax-family loss under MirroredStrategy on R logical
CPUs vs the dense loss on one device, and one TwoTowerModel step ``sharded`` vs ``replicated``.

Usage: ``python sharded_equivalence.py WORKDIR R [model] [chunk]`` (``model``: also one
TwoTowerModel step ``sharded`` vs ``replicated``; ``chunk``: that step with gradient caching,
``train.embedding_chunk=1``). Logical devices must be configured before TensorFlow runs any op, hence a fresh
process. Prints one JSON line with the measured differences; the test asserts on them.
"""

import json
import os
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
REPLICAS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
MODEL_STEP = "model" in sys.argv[3:]
CHUNK = "chunk" in sys.argv[3:]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)

from modeling_fixtures import VOCAB, make_batch, tiny_config  # noqa: E402

from ce_retrieval.losses import (  # noqa: E402
    CrossExampleNegativeMining,
    relevance_from_ids,
)
from ce_retrieval.losses.kernels.sharded import sharded_softmax_loss  # noqa: E402
from ce_retrieval.losses.kernels.softmax import softmax_loss  # noqa: E402
from ce_retrieval.modeling import build_two_tower, gather_from_replicas  # noqa: E402

# (name, cross_example, negative_fraction, top_k): the four losses, mining by fraction and by top_k
CASES = [
    ("SampledSoftmax", False, None, None),
    ("StochasticNegativeMining", False, 0.5, None),
    ("StochasticNegativeMining/top_k", False, None, 3),
    ("CrossExampleSoftmax", True, None, None),
    ("CrossExampleNegativeMining", True, 0.5, None),
    ("CrossExampleNegativeMining/top_k", True, None, 7),
]
# 16 rows; two captions of one image (same id) inside a replica and across the replica boundaries
IDS = np.array([0, 0, 1, 2, 3, 3, 4, 5, 6, 7, 7, 8, 9, 10, 11, 11], np.int64)
SCALE = 20.0


def split(strategy, array):
    """This replica's rows of ``array`` as a distributed value."""
    n = array.shape[0] // strategy.num_replicas_in_sync

    def rows(ctx):
        r = ctx.replica_id_in_sync_group
        return tf.constant(array[r * n : (r + 1) * n])

    return strategy.experimental_distribute_values_from_function(rows)


def local(strategy, value):
    return [t.numpy() for t in strategy.experimental_local_results(value)]


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def check_scores(strategy, case):
    """Scores with many ties (multiples of 1/8): Σ shares == L, rows' dL/dS == dense dL/dS."""
    _, cross, fraction, top_k = case
    rng = np.random.default_rng(1)
    scores = (np.round(rng.uniform(-1, 1, (16, 16)) * 8) / 8).astype(np.float32)
    relevance = relevance_from_ids(IDS, IDS)
    s = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(s)
        dense = softmax_loss(relevance, s, SCALE, cross, fraction, top_k)
    dense_grad = tape.gradient(dense, s).numpy()

    @tf.function
    def step(s_local, ids_local):
        def fn(s_r, ids_r):
            with tf.GradientTape() as tape:
                tape.watch(s_r)
                share = sharded_softmax_loss(
                    relevance_from_ids(ids_r, gather_from_replicas(ids_r)), s_r, SCALE, cross, fraction, top_k
                )
            return share, tape.gradient(share, s_r)

        return strategy.run(fn, args=(s_local, ids_local))

    shares, grads = step(split(strategy, scores), split(strategy, IDS))
    total = float(np.sum(local(strategy, shares)))
    return rel(total, float(dense)), rel(np.concatenate(local(strategy, grads)), dense_grad)


def check_embeddings(strategy, case):
    """T = norm(X_t W_t), V = norm(X_v W_v): Σ shares == L; dL/dX (through all_gather) and Σ_r dL/dW == dense."""
    _, cross, fraction, top_k = case
    rng = np.random.default_rng(2)
    x_t, x_v = (rng.normal(size=(16, 8)).astype(np.float32) for _ in range(2))
    w_t0, w_v0 = (rng.normal(size=(8, 6)).astype(np.float32) for _ in range(2))

    def loss_terms(xt, xv, wt, wv):
        return tf.math.l2_normalize(xt @ wt, -1), tf.math.l2_normalize(xv @ wv, -1)

    w_t, w_v = tf.Variable(w_t0), tf.Variable(w_v0)
    xt, xv = tf.constant(x_t), tf.constant(x_v)
    with tf.GradientTape() as tape:
        tape.watch([xt, xv])
        t, v = loss_terms(xt, xv, w_t, w_v)
        dense = softmax_loss(
            relevance_from_ids(IDS, IDS), tf.matmul(t, v, transpose_b=True), SCALE, cross, fraction, top_k
        )
    dense_grads = [g.numpy() for g in tape.gradient(dense, [xt, xv, w_t, w_v])]

    with strategy.scope():
        mw_t, mw_v = tf.Variable(w_t0), tf.Variable(w_v0)

    @tf.function
    def step(xt_local, xv_local, ids_local):
        def fn(xt_r, xv_r, ids_r):
            with tf.GradientTape() as tape:
                tape.watch([xt_r, xv_r])
                t_r, v_r = loss_terms(xt_r, xv_r, mw_t, mw_v)
                v_all, ids_all = gather_from_replicas(v_r), gather_from_replicas(ids_r)
                share = sharded_softmax_loss(
                    relevance_from_ids(ids_r, ids_all),
                    tf.matmul(t_r, v_all, transpose_b=True),
                    SCALE,
                    cross,
                    fraction,
                    top_k,
                )
            return (share, *tape.gradient(share, [xt_r, xv_r, mw_t, mw_v]))

        return strategy.run(fn, args=(xt_local, xv_local, ids_local))

    shares, g_xt, g_xv, g_wt, g_wv = step(split(strategy, x_t), split(strategy, x_v), split(strategy, IDS))
    total = float(np.sum(local(strategy, shares)))
    multi = [
        np.concatenate(local(strategy, g_xt)),
        np.concatenate(local(strategy, g_xv)),  # all_gather's gradient already sums the replicas' upstreams
        np.sum(local(strategy, g_wt), axis=0),  # Keras sums variable gradients over replicas
        np.sum(local(strategy, g_wv), axis=0),
    ]
    return rel(total, float(dense)), max(rel(m, d) for m, d in zip(multi, dense_grads, strict=True))


def tower_weights(model):
    return model.text_core.weights + model.image_core.weights


def build(strategy, vocab, batchnorm, partition, chunk=None):
    with strategy.scope():
        cfg = tiny_config()
        cfg.image.batchnorm = batchnorm
        model = build_two_tower(cfg, vocab)
        model.compile(
            loss=CrossExampleNegativeMining(),
            text_optimizer=tf_keras.optimizers.SGD(0.05),
            image_optimizer=tf_keras.optimizers.SGD(0.05),
            loss_partition=partition,
            embedding_chunk=chunk,
        )
    return model


def check_model_step(strategy, workdir):
    """One fit step (plain SGD, CrossExampleNegativeMining) == the ``replicated`` step (weights, logged loss):
    ``sharded`` (sync batch norm); with ``chunk``, ``sharded`` with gradient caching (chunks of one row; frozen
    batch norm, with which chunking is exact)."""
    vocab = os.path.join(workdir, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    batch = make_batch(num_images=6, captions_per_image=(2, 1, 1, 1, 1, 2))  # 8 rows, duplicate ids at 0-1, 6-7
    ds = tf.data.Dataset.from_tensors(batch).unbatch().batch(8, drop_remainder=True)
    if CHUNK:
        batchnorm, variants = "frozen", {"replicated": ("replicated",), "sharded_chunk": ("sharded", 1)}
    else:
        batchnorm, variants = "sync", {"replicated": ("replicated",), "sharded": ("sharded",)}
    models = {name: build(strategy, vocab, batchnorm, *args) for name, args in variants.items()}
    initial = models["replicated"].get_weights()
    for model in models.values():
        model.set_weights(initial)
    after, logs = {}, {}
    for name, model in models.items():
        logs[name] = model.fit(ds, epochs=1, verbose=0).history["loss"][0]
        after[name] = [w.numpy() for w in tower_weights(model)]
    ref = after["replicated"]
    out = {"batchnorm": batchnorm, "logged_loss": logs, "weight_diff": {}}
    out["step_size"] = max(
        float(np.abs(a - b).max()) for a, b in zip(ref, _initial_tower(models["replicated"], initial), strict=True)
    )
    for name in variants:
        out["weight_diff"][name] = max(float(np.abs(a - b).max()) for a, b in zip(after[name], ref, strict=True))
    return out


def _initial_tower(model, initial):
    """The initial values of ``tower_weights(model)`` (``initial`` is in ``model.get_weights()`` order)."""
    index = {id(w): i for i, w in enumerate(model.weights)}
    return [initial[index[id(w)]] for w in tower_weights(model)]


def main(workdir):
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    assert strategy.num_replicas_in_sync == REPLICAS
    result = {"replicas": REPLICAS, "losses": {}}
    start = time.perf_counter()
    for case in CASES:
        value_s, grad_s = check_scores(strategy, case)
        value_e, grad_e = check_embeddings(strategy, case)
        result["losses"][case[0]] = {
            "value_scores": value_s,
            "grad_scores": grad_s,
            "value_emb": value_e,
            "grad_emb": grad_e,
        }
    result["loss_seconds"] = time.perf_counter() - start
    if MODEL_STEP or CHUNK:  # model builds dominate the run time: the test runs them with 2 replicas only
        result["model"] = check_model_step(strategy, workdir)
    result["total_seconds"] = time.perf_counter() - start
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
