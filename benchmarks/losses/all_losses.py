"""Forward+backward cost of every registered loss, as a ratio to SampledSoftmax measured in the same run.

One step is what training does: ``S = normalize(Q) @ normalize(D)^T`` for N query and N document
embeddings of dimension d, ``loss(R, S)`` with ``R = I`` (the paper's setting), and the gradients with
respect to Q and D. It runs in three modes: ``eager`` (op by op), ``function`` (``tf.function``, TF graph)
and ``xla`` (``tf.function(jit_compile=True)``). Time is the median of ``--repeats`` steps after one warm-up
(which also compiles); the losses of one (mode, N) are timed in interleaved rounds so that load drift
hits all of them alike. With ``--memory``, each case also runs once in a
fresh subprocess that reports its peak resident set size (``ru_maxrss``) minus the RSS just before the
first step (inputs already built): the host memory the traced/compiled step needs, including
TensorFlow's temporaries and, for tf.function/XLA, the compiled program. A fresh process per case
avoids allocator caching between cases. On a shared machine timings are noisy: compare the same-run
ratios, not absolute seconds.

Every loss of ``ce_retrieval.losses.available()`` is included, so losses added later appear
automatically. Constructor arguments and size limits come from ``LOSS_SETTINGS`` below or from a class
attribute ``benchmark_settings = {"kwargs": {...}, "max_n": int, "reason": str}``.

    python -m benchmarks.losses.all_losses --sizes 512 2048 8192 --modes eager function xla
    python -m benchmarks.losses.all_losses --losses CrossExampleNegativeMining StochasticNegativeMining --sizes 8192
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

# isort: on

BASELINE = "SampledSoftmax"

#: Per-loss overrides: constructor kwargs, the largest N worth running (with the reason), and
#: ``columns_per_class``: S's columns are that many centres per class (SoftTriple), so query i is relevant
#: to the columns of class i // columns_per_class (R[i, j] = 1 iff i // K == j // K).
LOSS_SETTINGS: dict[str, dict] = {
    # SoftTriple: S = cos(E, proxies) [N, C * K]; the paper's K = 10 does not divide N = 512, so K = 8.
    "SoftTripleLoss": {"kwargs": {"proxies_per_class": 8}, "columns_per_class": 8},
}


def relevance_for(settings: dict, n: int) -> tf.Tensor:
    """R = I, or blocks of ``columns_per_class`` columns per class (see LOSS_SETTINGS)."""
    per_class = settings.get("columns_per_class", 1)
    if n % per_class:
        raise ValueError(f"N = {n} is not a multiple of columns_per_class = {per_class}")
    block = tf.range(n) // per_class
    return tf.cast(tf.equal(block[:, None], block[None, :]), tf.float32)


def make_inputs(loss, settings: dict, n: int, dim: int, seed: int):
    """(queries, documents, relevance): documents near their queries (positives score higher, as in training).
    A loss that ``needs_gram`` gets one embedding set (documents = queries) in pairs of one class, self-pairs
    ignored."""
    gen = tf.random.Generator.from_seed(seed)
    queries = gen.normal([n, dim])
    if loss.needs_gram:
        pair = tf.range(n) // 2
        same = tf.cast(tf.equal(pair[:, None], pair[None, :]), tf.float32)
        return queries, queries, tf.linalg.set_diag(same, -tf.ones([n]))
    return queries, queries + 0.5 * gen.normal([n, dim]), relevance_for(settings, n)


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def settings_for(name: str) -> dict:
    cls = losses.get(name).__class__
    settings = dict(getattr(cls, "benchmark_settings", {}) or {})
    settings.update(LOSS_SETTINGS.get(name, {}))
    return settings


def make_step(loss, mode: str):
    def step(queries, documents, relevance):
        with tf.GradientTape() as tape:
            tape.watch([queries, documents])
            scores = tf.matmul(tf.math.l2_normalize(queries, -1), tf.math.l2_normalize(documents, -1), transpose_b=True)
            value = loss(relevance, scores)
        grads = tape.gradient(value, [queries, documents])
        return value, grads

    if mode == "eager":
        return step
    return tf.function(step, jit_compile=(mode == "xla"))


def prepare(name: str, n: int, dim: int, mode: str, seed: int):
    """A warmed-up (traced, compiled) step closure for one case, or the reason it is skipped."""
    settings = settings_for(name)
    if settings.get("max_n") is not None and n > settings["max_n"]:
        return None, settings.get("reason", f"N > {settings['max_n']}")
    loss = losses.get(name, **settings.get("kwargs", {}))
    queries, documents, relevance = make_inputs(loss, settings, n, dim, seed)
    step = make_step(loss, mode)

    def run():
        value, grads = step(queries, documents, relevance)
        _ = [g.numpy() for g in grads]
        return float(value)

    run()
    return run, None


def measure_interleaved(names, n: int, dim: int, mode: str, repeats: int, seed: int) -> dict:
    """Times every loss once per round, ``repeats`` rounds, so machine-load drift hits all losses alike."""
    runs, results = {}, {}
    for name in names:
        run, reason = prepare(name, n, dim, mode, seed)
        if run is None:
            results[name] = {"skipped": reason}
        else:
            runs[name] = run
            results[name] = {"times": [], "peak": 0, "value": None}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            results[name]["value"] = run()
            results[name]["times"].append(time.perf_counter() - start)
    for name in runs:
        r = results[name]
        results[name] = {"seconds": statistics.median(r["times"]), "value": r["value"]}
    return results


def child_peak_memory(name: str, n: int, dim: int, mode: str, seed: int) -> float:
    """Run in a fresh process: peak RSS (MiB) of two steps above the RSS after the inputs are built."""
    settings = settings_for(name)
    loss = losses.get(name, **settings.get("kwargs", {}))
    queries, documents, relevance = make_inputs(loss, settings, n, dim, seed)
    step = make_step(loss, mode)
    before = _rss_bytes()
    for _ in range(2):
        _ = [g.numpy() for g in step(queries, documents, relevance)[1]]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return max(peak - before, 0) / 2**20


def peak_memory(name: str, n: int, dim: int, mode: str, seed: int) -> str:
    done = run_module(__spec__.name, "--child-memory", name, str(n), str(dim), mode, str(seed))
    lines = [line for line in done.stdout.splitlines() if line.startswith("PEAK_MIB ")]
    return f"{float(lines[-1].split()[1]):.0f}" if lines else "error"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 2048, 8192], help="batch sizes N (S is N x N)")
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension d")
    parser.add_argument(
        "--modes", nargs="+", default=["eager", "function", "xla"], choices=["eager", "function", "xla"]
    )
    parser.add_argument("--losses", nargs="+", default=None, help="subset of losses (default: all registered)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per case (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory", action="store_true", help="also measure peak RSS per case in a subprocess")
    parser.add_argument("--child-memory", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_memory:
        name, n, dim, mode, seed = args.child_memory
        print(f"PEAK_MIB {child_peak_memory(name, int(n), int(dim), mode, int(seed))}")
        return 0

    names = args.losses or losses.available()
    unknown = sorted(set(names) - set(losses.available()))
    if unknown:
        parser.error(f"unknown losses {unknown}; available: {losses.available()}")
    names = [BASELINE] + [n for n in names if n != BASELINE]

    print(
        f"# forward+backward per step, d={args.dim}, R=I (SoftTriple: 8 columns per class), median of {args.repeats}; "
        f"ratio = time / {BASELINE} time"
    )
    print(
        "# peak MiB = peak RSS of a fresh process above its RSS before the first step (--memory); '-' = not measured\n"
    )
    print("| loss | mode | N | seconds | ratio | peak MiB |")
    print("|---|---|---:|---:|---:|---:|")
    for mode in args.modes:
        for n in args.sizes:
            results = measure_interleaved(names, n, args.dim, mode, args.repeats, args.seed)
            base = results[BASELINE].get("seconds")
            for name in names:
                result = results[name]
                if "skipped" in result:
                    print(f"| {name} | {mode} | {n} | skipped: {result['skipped']} | | |")
                    continue
                ratio = result["seconds"] / base if base else float("nan")
                memory = peak_memory(name, n, args.dim, mode, args.seed) if args.memory else "-"
                print(f"| {name} | {mode} | {n} | {result['seconds']:.4f} | {ratio:.2f} | {memory} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
