"""Dense versus tiled softmax-family loss (issue #12): forward+backward time and peak memory at large N.

One step is what training does: ``Q, D = normalize(queries), normalize(documents)`` (N x d each, documents near
their queries), the loss with relevance from ids (``ids = arange(N)``, R = I) and the gradients with respect to
both embedding matrices. ``dense``: ``loss(R, Q Dᵀ)`` with ``R`` built from the ids inside the step (the whole
``[N, N]`` matrices); ``tiled``: ``loss.from_embeddings(Q, D, ids, ids)`` with ``tile_size`` set (``tiled.py``:
column tiles, no ``[N, N]`` matrix). Modes: ``function`` (``tf.function``) and ``xla`` (``jit_compile=True``).

Conventions of ``benchmarks/losses/all_losses.py``: time is the median of ``--repeats`` steps after one warm-up (which
also compiles), the cases of one (mode, N) timed in interleaved rounds so that load drift hits all alike; with
``--memory`` each case also runs twice in a fresh subprocess reporting its peak RSS (``ru_maxrss``) above the RSS
just before the first step (inputs built): the memory the step needs, including the compiled program. The dense
path is skipped where its estimated peak (``DENSE_MATRICES`` float32 ``[N, N]`` matrices) exceeds
``--dense-budget-gib``. Measure with nothing else running; on a loaded machine compare same-run ratios only.

    python -m benchmarks.scale.tiled --memory                       # the issue's table, N = 4096 ... 65536
    python -m benchmarks.scale.tiled --sizes 8192 --tile-sizes 256 512 1024 2048 --modes xla   # tile-size tuning
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

# isort: off
import ce_retrieval  # noqa: E402,F401  (legacy Keras before TensorFlow)
from benchmarks.common.machine import run_module  # noqa: E402
import tensorflow as tf  # noqa: E402
from ce_retrieval import losses  # noqa: E402
from ce_retrieval.losses.relevance import relevance_from_ids  # noqa: E402
from ce_retrieval.losses.kernels.tiled import default_tile_size  # noqa: E402

# isort: on

#: Rough peak of the dense step in float32 [N, N] matrices (S, logits, masks, exp, weights, gradients; measured
#: 4.3 at N = 8192 under XLA, rounded up): the dense path is skipped above --dense-budget-gib.
DENSE_MATRICES = 6


def dense_estimate_gib(n: int) -> float:
    return DENSE_MATRICES * 4 * n * n / 2**30


def make_inputs(n: int, dim: int, seed: int):
    gen = tf.random.Generator.from_seed(seed)
    queries = gen.normal([n, dim])
    return queries, queries + 0.5 * gen.normal([n, dim]), tf.range(n)


def make_step(name: str, path: str, mode: str):
    """``path``: ``dense`` or ``tiled:T`` (T = tile size)."""
    if path == "dense":
        loss = losses.get(name)

        def compute(q, d, ids):
            return loss(relevance_from_ids(ids, ids), tf.matmul(q, d, transpose_b=True))

    else:
        loss = losses.get(name, tile_size=int(path.split(":")[1]))

        def compute(q, d, ids):
            return loss.from_embeddings(q, d, ids, ids)

    def step(queries, documents, ids):
        with tf.GradientTape() as tape:
            tape.watch([queries, documents])
            value = compute(tf.math.l2_normalize(queries, -1), tf.math.l2_normalize(documents, -1), ids)
        return value, tape.gradient(value, [queries, documents])

    return tf.function(step, jit_compile=(mode == "xla"))


def prepare(name: str, path: str, n: int, dim: int, mode: str, seed: int):
    step = make_step(name, path, mode)
    inputs = make_inputs(n, dim, seed)

    def run():
        value, grads = step(*inputs)
        _ = [g.numpy() for g in grads]
        return float(value)

    run()
    return run


def measure_interleaved(cases, n: int, dim: int, mode: str, repeats: int, seed: int) -> dict:
    runs = {case: prepare(*case, n, dim, mode, seed) for case in cases}
    times = {case: [] for case in cases}
    values = {}
    for _ in range(repeats):
        for case, run in runs.items():
            start = time.perf_counter()
            values[case] = run()
            times[case].append(time.perf_counter() - start)
    return {case: (statistics.median(times[case]), values[case]) for case in cases}


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def child_peak_memory(name: str, path: str, n: int, dim: int, mode: str, seed: int) -> float:
    """In a fresh process: peak RSS (MiB) of two steps above the RSS after the inputs are built."""
    step = make_step(name, path, mode)
    inputs = make_inputs(n, dim, seed)
    before = _rss_bytes()
    for _ in range(2):
        _ = [g.numpy() for g in step(*inputs)[1]]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return max(peak - before, 0) / 2**20


def peak_memory(name: str, path: str, n: int, dim: int, mode: str, seed: int) -> str:
    args = [name, path, str(n), str(dim), mode, str(seed)]
    done = run_module(__spec__.name, "--child-memory", *args)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PEAK_MIB ")]
    return f"{float(lines[-1].split()[1]):.0f}" if lines else "error"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536], help="N = M")
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension d")
    parser.add_argument("--modes", nargs="+", default=["xla"], choices=["function", "xla"])
    parser.add_argument(
        "--losses", nargs="+", default=["CrossExampleSoftmax", "CrossExampleNegativeMining"], help="softmax family"
    )
    parser.add_argument(
        "--tile-sizes", type=int, nargs="+", default=None, help="tile widths T (default: tiled.default_tile_size(N))"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per case (median reported)")
    parser.add_argument("--dense-budget-gib", type=float, default=16.0, help="skip dense above this estimate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory", action="store_true", help="also measure peak RSS per case in a subprocess")
    parser.add_argument("--child-memory", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_memory:
        name, path, n, dim, mode, seed = args.child_memory
        print(f"PEAK_MIB {child_peak_memory(name, path, int(n), int(dim), mode, int(seed))}")
        return 0

    print(
        f"# forward+backward per step, N = M, d={args.dim}, R=I from ids, median of {args.repeats} (interleaved); "
        "ratio = tiled / dense time of the same run"
    )
    print("# peak MiB = peak RSS of a fresh process above its RSS before the first step (--memory); '-' = not measured")
    print(
        f"# dense skipped where its estimate ({DENSE_MATRICES} float32 [N, N] matrices) > {args.dense_budget_gib} GiB\n"
    )
    print("| loss | path | mode | N | seconds | ratio | peak MiB |")
    print("|---|---|---|---:|---:|---:|---:|")
    for mode in args.modes:
        for n in args.sizes:
            tiles = args.tile_sizes or [default_tile_size(n)]
            dense_fits = dense_estimate_gib(n) <= args.dense_budget_gib
            paths = (["dense"] if dense_fits else []) + [f"tiled:{t}" for t in tiles]
            cases = [(name, path) for name in args.losses for path in paths]
            results = measure_interleaved(cases, n, args.dim, mode, args.repeats, args.seed)
            for name in args.losses:
                if not dense_fits:
                    print(f"| {name} | dense | {mode} | {n} | skipped: estimate {dense_estimate_gib(n):.0f} GiB | | |")
                base = results.get((name, "dense"), (None,))[0]
                for path in paths:
                    seconds, _ = results[(name, path)]
                    ratio = f"{seconds / base:.2f}" if base else "-"
                    memory = peak_memory(name, path, n, args.dim, mode, args.seed) if args.memory else "-"
                    print(f"| {name} | {path} | {mode} | {n} | {seconds:.3f} | {ratio} | {memory} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
