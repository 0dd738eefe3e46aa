"""Collectives of the objective's gathers across replicas: the library's against the former gathers, in one process.

    python -m benchmarks.scale.replica_gather

The replicated objective gathers queries, documents and both id vectors across replicas (``utils.replicas``). The
former ``gather_from_replicas`` ran two all-gathers per tensor (the tensor and its row count, for the backward
offset), ids included; the library now gathers ids once (no gradient, no offset) and computes the replica's offset
once for paired rows. This runs Cross-Example Softmax's replicated step (value and gradient w.r.t. both embedding
sets) under MirroredStrategy on 2 logical CPUs with both, and reports the all-gathers in the step's graph, the
median graph step and the eager step (where TensorFlow traces a function per all-gather). The baseline is the
former code, kept below only for this comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from benchmarks.common.machine import LoadSampler, machine_info  # noqa: E402
from benchmarks.common.records import write_record  # noqa: E402
from ce_retrieval import losses  # noqa: E402
from ce_retrieval.objective import RetrievalObjective  # noqa: E402
from ce_retrieval.objective import objective as objective_module  # noqa: E402


def former_gather(x, offset=None):
    """The former ``gather_from_replicas``: the tensor and its row count gathered for every tensor, ids included."""
    ctx = tf.distribute.get_replica_context()

    @tf.custom_gradient
    def _gather(value):
        gathered = ctx.all_gather(value, axis=0)
        sizes = ctx.all_gather(tf.shape(value)[:1], axis=0)
        start = tf.reduce_sum(sizes[: tf.cast(ctx.replica_id_in_sync_group, tf.int32)])

        def grad(upstream):
            total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, upstream)
            return total[start : start + tf.shape(value)[0]]

        return gathered, grad

    return _gather(x)


def measure(strategy, rows: int, dim: int, steps: int, former: bool) -> dict:
    saved = objective_module.gather_from_replicas, objective_module.replica_offset
    if former:
        objective_module.gather_from_replicas = former_gather
        objective_module.replica_offset = lambda x: None
    try:
        rng = np.random.default_rng(0)
        unit = lambda a: (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float32)  # noqa: E731
        text, image = unit(rng.normal(size=(rows, dim))), unit(rng.normal(size=(rows, dim)))
        ids = np.arange(rows, dtype=np.int64) // 2  # two captions per image
        objective = RetrievalObjective(losses.CrossExampleSoftmax(), 20.0)
        half = rows // 2

        def split(array):
            return strategy.experimental_distribute_values_from_function(
                lambda ctx: tf.constant(array[ctx.replica_id_in_sync_group * half :][:half])
            )

        def replica_step(t, v, i):
            with tf.GradientTape() as tape:
                tape.watch([t, v])
                share = objective(t, v, i).share
            return share, tape.gradient(share, [t, v])

        def step(t, v, i):
            return strategy.run(replica_step, args=(t, v, i))

        inputs = (split(text), split(image), split(ids))
        eager = []
        for _ in range(3):
            t0 = time.perf_counter()
            step(*inputs)
            eager.append(time.perf_counter() - t0)
        graph = tf.function(step)
        calls = []  # the all-gathers the step issues (both replicas), counted while it is traced
        all_gather = tf.distribute.ReplicaContext.all_gather
        tf.distribute.ReplicaContext.all_gather = lambda ctx, *a, **k: calls.append(1) or all_gather(ctx, *a, **k)
        try:
            graph.get_concrete_function(*inputs)
        finally:
            tf.distribute.ReplicaContext.all_gather = all_gather
        gathers = len(calls)
        graph(*inputs)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            graph(*inputs)
            times.append(time.perf_counter() - t0)
        return {
            "graph_step_s": float(np.median(times)),
            "eager_step_s": float(np.median(eager)),
            "all_gathers": gathers,
        }
    finally:
        objective_module.gather_from_replicas, objective_module.replica_offset = saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=512, help="global batch")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--results", default=os.path.join("benchmarks", "results"))
    args = parser.parse_args(argv)
    loads: list = []
    sampler = LoadSampler(loads, every=5.0)
    sampler.start()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    former = measure(strategy, args.rows, args.dim, args.steps, former=True)
    library = measure(strategy, args.rows, args.dim, args.steps, former=False)
    sampler.stop.set()
    record = {
        "command": " ".join(
            ["python -m benchmarks.scale.replica_gather", *(argv if argv is not None else sys.argv[1:])]
        ),
        "rows": args.rows,
        "dim": args.dim,
        "former": former,
        "library": library,
        "graph_ratio": former["graph_step_s"] / library["graph_step_s"],
        "eager_ratio": former["eager_step_s"] / library["eager_step_s"],
        "machine": machine_info(loads),
    }
    m = record["machine"]
    text = "\n".join(
        [
            "# The objective's gathers across replicas (2 logical CPUs)",
            "",
            f"    {record['command']}",
            "",
            f"Cross-Example Softmax, replicated step (value and gradient), global batch {args.rows}, d = {args.dim}, "
            f"MirroredStrategy on 2 logical CPUs; median of {args.steps} graph steps and of 3 eager steps. "
            f"Machine: {m['cpu']}, {m['cores']} cores, load {m['load_min']:.2f}–{m['load_max']:.2f}, {m['date']}.",
            "",
            "| gathers | all-gathers per step (both replicas) | graph step | eager step |",
            "|---|---:|---:|---:|",
            f"| former (tensor + row count each) | {former['all_gathers']} | {1000 * former['graph_step_s']:.2f} ms "
            f"| {1000 * former['eager_step_s']:.0f} ms |",
            f"| library (ids once, one offset) | {library['all_gathers']} | {1000 * library['graph_step_s']:.2f} ms "
            f"| {1000 * library['eager_step_s']:.0f} ms |",
            "",
            f"Former / library: graph step {record['graph_ratio']:.2f}×, eager step {record['eager_ratio']:.2f}×.",
        ]
    )
    write_record(args.results, "replica_gather", record, text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
