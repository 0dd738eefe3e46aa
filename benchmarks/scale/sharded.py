"""Replicated versus sharded softmax-family loss over replicas (issue #12, part 2): forward+backward time per step.

One step is the loss part of a training step on a global batch of N rows split over R replicas (unit embeddings
``Q, D``, N x d, documents near their queries, ``ids = arange(N)``), with the gradients w.r.t. each replica's
``Q_r, D_r``:

* ``replicated``: gather Q, D and ids, every replica computes the global ``[N, N]`` loss L and differentiates L/R
  (``TwoTowerModel``'s default, ``train.loss_partition=replicated``);
* ``sharded``: gather D and ids only, replica r computes its ``[N/R, N]`` rows' share
  (``ce_retrieval.losses.kernels.sharded``, ``train.loss_partition=sharded``);
* ``one device``: the dense loss on the whole batch (R = 1; both modes are the same there).

R replicas are R logical CPU devices of this one machine (``MirroredStrategy``): they share the same cores, so
the wall time of a step is the SUM of the replicas' work (plus collectives): ``replicated`` does R x the one-device
loss work, ``sharded`` about 1 x. Per replica (on R real devices) that is L-work vs L-work / R. Time is the median
of ``--repeats`` steps after one warm-up (tracing), cases timed in interleaved rounds. Measure with nothing else
running; on a loaded machine compare same-run ratios only. Prints a Markdown table; writes nothing.

    python -m benchmarks.scale.sharded                                  # CE, N = 4096, d = 128, R in 1, 2, 4
    python -m benchmarks.scale.sharded --size 256 --repeats 1           # smoke test
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

# isort: off
import ce_retrieval  # noqa: E402,F401  (legacy Keras before TensorFlow)
import tensorflow as tf  # noqa: E402

# isort: on

LOSSES = {  # name -> (cross_example, negative_fraction)
    "ce": (True, None),
    "cenm": (True, 0.5),
    "sampled": (False, None),
    "snm": (False, 0.5),
}


def make_inputs(size: int, dim: int, seed: int):
    gen = tf.random.Generator.from_seed(seed)
    queries = gen.normal([size, dim])
    documents = queries + 0.5 * gen.normal([size, dim])
    return queries, documents, tf.range(size, dtype=tf.int64)


def make_step(strategy, partition: str, cross_example: bool, fraction):
    """A ``tf.function``: per replica, (objective, dQ_r, dD_r) of its rows (see module docstring)."""
    from ce_retrieval.losses.kernels.sharded import sharded_softmax_loss
    from ce_retrieval.losses.kernels.softmax import softmax_loss
    from ce_retrieval.losses.relevance import relevance_from_ids
    from ce_retrieval.modeling.similarity import gather_from_replicas, num_replicas

    def replica_fn(q_r, d_r, ids_r):
        with tf.GradientTape() as tape:
            tape.watch([q_r, d_r])
            q, d = tf.math.l2_normalize(q_r, -1), tf.math.l2_normalize(d_r, -1)
            d_all, ids_all = gather_from_replicas(d), gather_from_replicas(ids_r)
            if partition == "sharded":
                scores = tf.matmul(q, d_all, transpose_b=True)
                objective = sharded_softmax_loss(
                    relevance_from_ids(ids_r, ids_all), scores, 20.0, cross_example, fraction
                )
            else:
                scores = tf.matmul(gather_from_replicas(q), d_all, transpose_b=True)
                loss = softmax_loss(relevance_from_ids(ids_all, ids_all), scores, 20.0, cross_example, fraction)
                objective = loss / float(num_replicas())
        return (objective, *tape.gradient(objective, [q_r, d_r]))

    @tf.function
    def step(q, d, ids):
        return strategy.run(replica_fn, args=(q, d, ids))

    return step


def distribute(strategy, tensors):
    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return tensors
    rows = tensors[0].shape[0] // replicas

    def value(i):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tensors[i][ctx.replica_id_in_sync_group * rows : (ctx.replica_id_in_sync_group + 1) * rows]
        )

    return tuple(value(i) for i in range(len(tensors)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=4096, help="global batch N")
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension d")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4], help="R (logical CPU devices)")
    parser.add_argument("--loss", choices=sorted(LOSSES), default="ce")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per case (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if any(args.size % r for r in args.replicas):
        parser.error(f"--size {args.size} must be divisible by every R in {args.replicas}")

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * max(args.replicas))
    cross_example, fraction = LOSSES[args.loss]
    inputs = make_inputs(args.size, args.dim, args.seed)

    cases = []  # (R, partition, step, distributed inputs)
    for replicas in args.replicas:
        if replicas == 1:
            strategy = tf.distribute.get_strategy()
            partitions = ["one device"]
        else:
            # Strategies of different sizes in one process need disjoint collective group keys (each instance
            # starts at the class's ``_collective_key_base`` + 1; a clash aborts "joining a group with size ...").
            mirrored = type(
                f"Mirrored{replicas}", (tf.distribute.MirroredStrategy,), {"_collective_key_base": 1000 * replicas}
            )
            strategy = mirrored([f"/cpu:{i}" for i in range(replicas)])
            partitions = ["replicated", "sharded"]
        for partition in partitions:
            mode = "replicated" if partition == "one device" else partition
            cases.append(
                (replicas, partition, make_step(strategy, mode, cross_example, fraction), distribute(strategy, inputs))
            )

    for _, _, step, dist in cases:  # warm-up: tracing
        step(*dist)
    times = {i: [] for i in range(len(cases))}
    for _ in range(args.repeats):  # interleaved rounds
        for i, (_, _, step, dist) in enumerate(cases):
            start = time.perf_counter()
            out = step(*dist)
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
            times[i].append(time.perf_counter() - start)

    base = statistics.median(times[0]) if cases[0][0] == 1 else None
    print(f"\n{args.loss} loss, N = {args.size}, d = {args.dim}, median of {args.repeats} steps (forward + backward)\n")
    print("| R | partition | loss rows per replica | step wall time (s) | per-replica estimate (s) | vs one device |")
    print("|---|---|---|---|---|---|")
    for i, (replicas, partition, _, _) in enumerate(cases):
        wall = statistics.median(times[i])
        rows = args.size if partition != "sharded" else args.size // replicas
        ratio = f"{wall / replicas / base:.2f}" if base else "-"
        print(f"| {replicas} | {partition} | {rows} | {wall:.3f} | {wall / replicas:.3f} | {ratio} |")
    print(
        "\nR logical devices share this machine's cores: wall time ~ the sum of the replicas' work; the per-replica "
        "estimate is wall / R (the time on R real devices, collectives aside)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
