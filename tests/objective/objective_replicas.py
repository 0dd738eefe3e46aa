"""Run as a subprocess by test_objective_replicas.py: the objective and the sharded loss under MirroredStrategy on R
logical CPUs vs one device, every R in one process (R logical CPUs of max R). Usage:
``python objective_replicas.py R [R ...] [all]``; prints one JSON line of relative differences per R.

``objective``: for every registered loss, the replicated dense path: Σ_r (share_r) = L and the replicas' embedding
gradients (through all_gather) = the one-device gradients of L. For the softmax family also tiled, sharded and
sharded + tiled (T = 3, bidirectional and learned λ included), and for SigLIP the same paths with learned t and b.
R = 2 checks every loss and path (``all``: any R does); R = 4 the subset ``AT_FOUR`` (a cross-example loss with
mining, a pair loss, a proxy loss on the dense path; the sharded + tiled paths that combine the partition function,
the mining histograms and SigLIP's b across replicas and tiles).
The checks run eagerly (MirroredStrategy runs each replica in a thread; the same replica-context code as in a graph,
without a trace per check, which made the harness 2.5x slower), gathering by concatenation on one device
(``strategies_for``); ``GRAPH_TOO`` are also checked inside a ``tf.function`` with the default collective
all-gathers, as training runs them.
``sharded``: the sharded softmax-family loss (``ce_retrieval.losses.kernels.sharded``) on 16 rows for the four losses,
mining by fraction and by top_k, at every R: Σ shares = L and dL/dS (scores with many ties); for top_k mining (the
objective's paths above mine by the default fraction) also dL/dX through all_gather and Σ_r dL/dW of shared weights.
A whole TwoTowerModel step under replicas, on each loss path: tests/modeling/model_step_replicas.py.
Logical devices must be configured before TensorFlow runs any op, hence a fresh process.
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
REPLICA_COUNTS = [int(a) for a in sys.argv[1:] if a.isdigit()] or [2]
EVERY_CHECK = "all" in sys.argv[1:]  # else R = 4 checks the subset AT_FOUR

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * max(REPLICA_COUNTS))

from replica_paths import AT_FOUR, FAMILY_PATHS, GRAPH_TOO, SIGLIP_PATHS, family_with_every_path  # noqa: E402  (this file's folder: sys.path[0])

from ce_retrieval import losses  # noqa: E402
from ce_retrieval.configs.experiment import LossConfig  # noqa: E402
from ce_retrieval.losses import relevance_from_ids  # noqa: E402
from ce_retrieval.losses.kernels.sharded import sharded_softmax_loss  # noqa: E402
from ce_retrieval.losses.kernels.softmax import softmax_loss  # noqa: E402
from ce_retrieval.modeling import gather_from_replicas  # noqa: E402
from ce_retrieval.modeling.config import ModelConfig  # noqa: E402
from ce_retrieval.objective import LogitBias, LogitScale, RetrievalObjective  # noqa: E402
from ce_retrieval.tasks import build_loss  # noqa: E402
from ce_retrieval.utils.seeding import seed_everything  # noqa: E402

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


def replicas(strategy, make, graph=False):
    with strategy.scope():
        objective, scale = make()
    split = ROWS // strategy.num_replicas_in_sync

    def rows(array):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(
                array[ctx.replica_id_in_sync_group * split : (ctx.replica_id_in_sync_group + 1) * split]
            )
        )

    def step(text, image, ids):
        def fn(t, v, i):
            with tf.GradientTape() as tape:
                tape.watch([t, v])
                share = objective(t, v, i).share
            grads = tape.gradient(share, [t, v, *scale.trainable_variables])
            return share, [tf.zeros_like(t) if g is None else g for g in grads]

        return strategy.run(fn, args=(text, image, ids))

    if graph:  # no tensor-dependent Python control flow: conversion would only cost trace time
        step = tf.function(step, autograph=False)
    shares, grads = step(rows(TEXT), rows(IMAGE), rows(IDS))
    local = lambda x: [t.numpy() for t in strategy.experimental_local_results(x)]  # noqa: E731
    total = float(np.sum(local(shares)))
    out = [np.concatenate(local(grads[0])), np.concatenate(local(grads[1]))]
    out += [np.sum(local(g), axis=0) for g in grads[2:]]  # a variable's gradient: summed over replicas by Keras
    return total, out


def compare(strategies, make, key):
    """{value, grads}: the replicas (eagerly) against one device; for ``GRAPH_TOO`` also {graph_value, graph_grads}.
    ``strategies``: (eager, graph), see :func:`strategies_for`."""
    objective, scale = make()
    want, want_grads = one_device(objective, scale)
    out = {}
    for prefix, graph in (("", False), ("graph_", True)) if key in GRAPH_TOO else (("", False),):
        got, got_grads = replicas(strategies[graph], make, graph)
        out[f"{prefix}value"] = rel(got, want)
        out[f"{prefix}grads"] = max(rel(g, w) for g, w in zip(got_grads, want_grads, strict=True))
    return out


def here(key: str, replicas: int) -> bool:
    """Whether ``key`` is checked at R = ``replicas`` (module docstring): every key at R = 2, ``AT_FOUR`` at R = 4."""
    return EVERY_CHECK or replicas != 4 or key in AT_FOUR


def check_objective(strategies):
    """The objective's paths (module docstring): {name/path: {value, grads[, graph_value, graph_grads]}}."""
    strategy, results = strategies[0], {}
    for name in losses.available():
        key = f"{name}/replicated"
        if not here(key, strategy.num_replicas_in_sync):
            continue
        bias = -10.0 if losses.lookup(name).has_logit_bias else None  # SigLIP: b is the objective's, like λ
        loss = build_loss(LossConfig(name=name), ModelConfig(logit_bias=bias))
        results[key] = compare(
            strategies, lambda loss=loss, bias=bias: (RetrievalObjective(loss, logit_bias=bias), LogitScale()), key
        )
    for name in family_with_every_path():  # MixedSoftmax is dense only, covered above
        for partition, tile, bidirectional, learn in FAMILY_PATHS:
            key = f"{name}/{partition}/tile{tile}/bi{int(bidirectional)}/learn{int(learn)}"
            if not here(key, strategy.num_replicas_in_sync):
                continue
            kwargs = {"bidirectional": bidirectional}
            loss = build_loss(LossConfig(name=name, kwargs=kwargs), ModelConfig(learn_logit_scale=learn))

            def make(loss=loss, partition=partition, tile=tile, learn=learn):
                scale = LogitScale(20.0, learn=learn)
                return RetrievalObjective(loss, scale, partition=partition, tile_size=tile), scale

            results[key] = compare(strategies, make, key)
    learned = ModelConfig(logit_scale=10.0, learn_logit_scale=True, logit_bias=-10.0, learn_logit_bias=True)
    siglip = build_loss(LossConfig(name="SigmoidLoss"), learned)
    for partition, tile in SIGLIP_PATHS:
        key = f"SigmoidLoss/{partition}/tile{tile}/learn1"
        if not here(key, strategy.num_replicas_in_sync):
            continue

        def make(partition=partition, tile=tile):
            scale, bias = LogitScale(10.0, learn=True), LogitBias(-10.0, learn=True)
            objective = RetrievalObjective(siglip, scale, partition=partition, tile_size=tile, logit_bias=bias)
            return objective, objective  # its trainable_variables: t' and b

        results[key] = compare(strategies, make, key)
    return results


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
SHARDED_IDS = np.array([0, 0, 1, 2, 3, 3, 4, 5, 6, 7, 7, 8, 9, 10, 11, 11], np.int64)
SHARDED_SCALE = 20.0


def split(strategy, array):
    """This replica's rows of ``array`` as a distributed value."""
    n = array.shape[0] // strategy.num_replicas_in_sync

    def rows(ctx):
        r = ctx.replica_id_in_sync_group
        return tf.constant(array[r * n : (r + 1) * n])

    return strategy.experimental_distribute_values_from_function(rows)


def local(strategy, value):
    return [t.numpy() for t in strategy.experimental_local_results(value)]


def check_scores(strategy, case):
    """Scores with many ties (multiples of 1/8): Σ shares == L, rows' dL/dS == dense dL/dS."""
    _, cross, fraction, top_k = case
    rng = np.random.default_rng(1)
    scores = (np.round(rng.uniform(-1, 1, (16, 16)) * 8) / 8).astype(np.float32)
    relevance = relevance_from_ids(SHARDED_IDS, SHARDED_IDS)
    s = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(s)
        dense = softmax_loss(relevance, s, SHARDED_SCALE, cross, fraction, top_k)
    dense_grad = tape.gradient(dense, s).numpy()

    def step(s_local, ids_local):
        def fn(s_r, ids_r):
            with tf.GradientTape() as tape:
                tape.watch(s_r)
                share = sharded_softmax_loss(
                    relevance_from_ids(ids_r, gather_from_replicas(ids_r)), s_r, SHARDED_SCALE, cross, fraction, top_k
                )
            return share, tape.gradient(share, s_r)

        return strategy.run(fn, args=(s_local, ids_local))

    shares, grads = step(split(strategy, scores), split(strategy, SHARDED_IDS))
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
            relevance_from_ids(SHARDED_IDS, SHARDED_IDS),
            tf.matmul(t, v, transpose_b=True),
            SHARDED_SCALE,
            cross,
            fraction,
            top_k,
        )
    dense_grads = [g.numpy() for g in tape.gradient(dense, [xt, xv, w_t, w_v])]

    with strategy.scope():
        mw_t, mw_v = tf.Variable(w_t0), tf.Variable(w_v0)

    def step(xt_local, xv_local, ids_local):
        def fn(xt_r, xv_r, ids_r):
            with tf.GradientTape() as tape:
                tape.watch([xt_r, xv_r])
                t_r, v_r = loss_terms(xt_r, xv_r, mw_t, mw_v)
                v_all, ids_all = gather_from_replicas(v_r), gather_from_replicas(ids_r)
                share = sharded_softmax_loss(
                    relevance_from_ids(ids_r, ids_all),
                    tf.matmul(t_r, v_all, transpose_b=True),
                    SHARDED_SCALE,
                    cross,
                    fraction,
                    top_k,
                )
            return (share, *tape.gradient(share, [xt_r, xv_r, mw_t, mw_v]))

        return strategy.run(fn, args=(xt_local, xv_local, ids_local))

    shares, g_xt, g_xv, g_wt, g_wv = step(split(strategy, x_t), split(strategy, x_v), split(strategy, SHARDED_IDS))
    total = float(np.sum(local(strategy, shares)))
    multi = [
        np.concatenate(local(strategy, g_xt)),
        np.concatenate(local(strategy, g_xv)),  # all_gather's gradient already sums the replicas' upstreams
        np.sum(local(strategy, g_wt), axis=0),  # Keras sums variable gradients over replicas
        np.sum(local(strategy, g_wv), axis=0),
    ]
    return rel(total, float(dense)), max(rel(m, d) for m, d in zip(multi, dense_grads, strict=True))


def check_sharded(strategy):
    """The sharded loss (module docstring): {case: {value_scores, grad_scores[, value_emb, grad_emb]}}."""
    results = {}
    for case in CASES:
        value_s, grad_s = check_scores(strategy, case)
        results[case[0]] = {"value_scores": value_s, "grad_scores": grad_s}
        if case[3] is not None:  # top_k mining: the objective's sharded paths mine by the default fraction only
            value_e, grad_e = check_embeddings(strategy, case)
            results[case[0]].update(value_emb=value_e, grad_emb=grad_e)
    return results


def strategies_for(replicas: int):
    """(eager, graph): two MirroredStrategy over the first ``replicas`` logical CPUs. The graph one is the default
    (collective all-gathers, as training runs them, inside a ``tf.function``). The eager one gathers by concatenating
    on one device (``ReductionToOneDevice``): eagerly, the collective implementation traces a new ``tf.function`` for
    every all-gather (TensorFlow's ``CollectiveAllReduce._batch_all_gather``), about 0.2 s each, which was two thirds
    of this harness (R = 2: 100 s against 26 s, the same checks and differences). The objective's gathers and their
    gradients (``ReplicaContext.all_gather``) are the same code above either."""
    devices = [f"/cpu:{i}" for i in range(replicas)]
    # a strategy per R in one process: their collectives need distinct group keys (TensorFlow's own tests set
    # this class attribute for the same reason; by default every MirroredStrategy starts at group key 1)
    tf.distribute.MirroredStrategy._collective_key_base = 10_000 * replicas
    graph = tf.distribute.MirroredStrategy(devices)
    tf.distribute.MirroredStrategy._collective_key_base = 10_000 * replicas + 5_000
    eager = tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    assert graph.num_replicas_in_sync == eager.num_replicas_in_sync == replicas
    return eager, graph


def main():
    # GRAPH_TOO's graphs run once: Grappler's rewrites (value-preserving) cost more than they save
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    for replicas in REPLICA_COUNTS:
        seed_everything(0, deterministic=False)  # the same initial weights at every R (after the logical devices)
        strategies = strategies_for(replicas)
        result = {"replicas": replicas, "results": check_objective(strategies), "losses": check_sharded(strategies[0])}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
