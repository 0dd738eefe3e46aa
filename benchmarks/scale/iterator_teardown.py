"""How long destroying the training set's ``tf.data`` iterator takes, with and without tf.data's autotuning thread.

Why. Trainings of the main job sometimes ended about 40 s late: the process waited at the end of ``model.fit``
while the training iterator was destroyed (``IteratorResource::~IteratorResource`` waiting for a background thread
of tf.data). The autotuning thread re-optimises the pipeline after waits of 10, 20, 40, ... ms (doubling, at most
60 s); an iterator destroyed during the 13th wait (from 40.95 s to 81.91 s after its start) that misses its wake-up
waits until the wait runs out. ``train_pipeline`` now switches that thread off (``ce_retrieval/data/pipeline.py``).

What. ``--per_kind`` children of each kind start at once (the cores are over-subscribed on purpose: the late
wake-up shows on busy cores, as in a training). Each builds the main job's training pipeline
(``data.train_pipeline`` on ``synthetic_demo``; ``--workload minimal``: the same chain of tf.data ops over integers
with the same options, no package code), ``autotune`` re-enabling the thread through ``tf.data.Options``
and ``pipeline`` leaving the pipeline as the package builds it, takes batches while doing CPU work, destroys the
iterator ``--seconds`` after creating it (45 s: a 500-step training) and reports how long that took. A teardown over
5 s counts as a stall; the record gives the iterator's age when each stall ended, next to the nearest end of an
autotuning wait, 10 (2^k - 1) ms.

    python -m benchmarks.scale.iterator_teardown     # writes benchmarks/results/iterator_teardown.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks import ROOT
from benchmarks.common.machine import LoadSampler, load_average, machine_info
from benchmarks.common.records import write_record

CHILD = """
import json, sys, time
import numpy as np
import tensorflow as tf
kind, seconds, workload = sys.argv[1], float(sys.argv[2]), sys.argv[3]
if workload == "pipeline":
    from ce_retrieval import configs, data
    from ce_retrieval.cli.train import resolve_config
    cfg = configs.load_experiment(resolve_config("synthetic_demo"), [])
    ds = data.train_pipeline(cfg.data, "train", cfg.train.batch_size, seed=0)
else:  # the same chain of tf.data ops over integers, with train_pipeline's options
    ds = tf.data.Dataset.from_tensor_slices(np.arange(3000, dtype=np.int64))
    ds = ds.map(lambda x: 2 * x, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.shuffle(3000, seed=0).repeat().batch(64, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.autotune.enabled = False
    ds = ds.with_options(options)
if kind == "autotune":
    options = tf.data.Options()
    options.autotune.enabled = True
    ds = ds.with_options(options)
enabled = bool(ds.options().autotune.enabled)
rng = np.random.default_rng(0)
it = iter(ds)
start = time.time()
batches = 0
while time.time() - start < seconds:
    next(it)
    np.linalg.svd(rng.random((120, 120)))  # CPU work between batches, as a train step would do
    batches += 1
iterated = time.time() - start
del it
teardown = time.time() - start - iterated
print(json.dumps({"kind": kind, "autotune_enabled": enabled, "batches": batches, "iterated_s": iterated,
                  "teardown_s": teardown}))
"""
KINDS = ("autotune", "pipeline")
WHAT = {
    "pipeline": "the main job's training pipeline",
    "minimal": "the training pipeline's chain of tf.data ops over integers (no package code)",
}
STALL_S = 5.0


def run(per_kind: int, seconds: float, workload: str = "pipeline") -> list[dict]:
    """``per_kind`` children of each kind, all at once, interleaved, each destroying its iterator ``seconds`` after
    creating it; their reports."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "TF_USE_LEGACY_KERAS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, kind, str(seconds), workload],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for _ in range(per_kind)
        for kind in KINDS
    ]
    reports = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a child failed (exit {p.returncode}):\n{err[-2000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def wait_end(age_s: float) -> str:
    """The end of the autotuning thread's k-th wait nearest to ``age_s``: waits of 10, 20, 40, ... ms end at
    10 (2^k - 1) ms after the iterator's start (below the 60 s cap)."""
    k = min(range(1, 14), key=lambda k: abs(0.01 * (2**k - 1) - age_s))
    return f"wait {k} ends at {0.01 * (2**k - 1):.2f} s"


def summarise(reports: list[dict]) -> dict:
    out = {}
    for kind in KINDS:
        t = sorted(r["teardown_s"] for r in reports if r["kind"] == kind)
        out[kind] = {
            "children": len(t),
            "stalls": sum(v > STALL_S for v in t),
            "teardown_s_median": t[len(t) // 2],
            "teardown_s_max": t[-1],
            "autotune_enabled": sorted({r["autotune_enabled"] for r in reports if r["kind"] == kind}),
        }
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per_kind", type=int, default=8, help="children of each kind (all run at once)")
    ap.add_argument("--seconds", type=float, default=45.0, help="an iterator's age at its teardown (a training)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of 2 x per_kind children, one after another")
    ap.add_argument(
        "--workload",
        choices=["pipeline", "minimal"],
        default="pipeline",
        help="the main job's training pipeline, or the same chain of tf.data ops over integers (no package code)",
    )
    ap.add_argument("--name", default="iterator_teardown", help="the record's file name")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args(argv)
    load_before = load_average()
    loads: list = []
    sampler = LoadSampler(loads, every=30.0)
    sampler.start()
    start = time.perf_counter()
    reports = []
    for r in range(args.rounds):
        reports += [{**x, "round": r} for x in run(args.per_kind, args.seconds, args.workload)]
        print(f"round {r}: {json.dumps(summarise(reports))}", flush=True)
    sampler.stop.set()
    summary = summarise(reports)
    command = f"python -m benchmarks.scale.iterator_teardown --per_kind {args.per_kind} --seconds {args.seconds:g} "
    command += f"--rounds {args.rounds} --workload {args.workload} --name {args.name}"
    record = {
        "command": command,
        "machine": machine_info(loads),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "seconds": time.perf_counter() - start,
        "workload": args.workload,
        "stall_threshold_s": STALL_S,
        "summary": summary,
        "children": reports,
    }
    rows = "\n".join(
        f"| {kind} | {'on' if s['autotune_enabled'] == [True] else 'off'} | {s['children']} | {s['stalls']} | "
        f"{s['teardown_s_median']:.2f} | {s['teardown_s_max']:.2f} |"
        for kind, s in summary.items()
    )
    lives = sorted(r["iterated_s"] for r in reports)
    life = f"{lives[0]:.1f} – {lives[-1]:.1f} s old at their teardown"
    stalled = [r for r in reports if r["teardown_s"] > STALL_S]
    ends = ", ".join(
        f"{r['iterated_s'] + r['teardown_s']:.2f} s ({wait_end(r['iterated_s'] + r['teardown_s'])})" for r in stalled
    )
    m = record["machine"]
    text = f"""# Destroying the training iterator, with and without tf.data's autotuning thread

    {command}

{m["cpu"]}, {m["cores"]} cores, {m["date"]}; load {m["load_min"]:.1f}–{m["load_max"]:.1f} during the run \
(average before {load_before}, after {record["load_average_after"]}); \
{record["seconds"]:.0f} s. {2 * args.per_kind} children at once per round ({args.rounds} rounds), each taking \
batches of {WHAT[args.workload]} with CPU work between them, then destroying the iterator \
{args.seconds:g} s after creating it (iterators {life}). The cores are over-subscribed on purpose (the stall \
shows on busy cores, as during a training).

| kind | autotuning thread | children | teardowns over {STALL_S:g} s | median teardown (s) | longest teardown (s) |
|---|---|---:|---:|---:|---:|
{rows}

`autotune`: the pipeline with `Options.autotune.enabled` set back to true (as before the change); `pipeline`: the
pipeline with the options `ce_retrieval.data.train_pipeline` gives it (thread off). Seconds from the iterator's start
to the end of each stalled teardown, with the nearest end of an autotuning wait: {ends or "no stall"}.
"""
    write_record(args.out, args.name, record, text)


if __name__ == "__main__":
    main()
