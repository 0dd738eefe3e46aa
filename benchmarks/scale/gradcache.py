"""Gradient caching (``train.embedding_chunk``) vs the plain train step: peak memory and time per example.

The demo model (the towers of ``configs/synthetic_demo.yaml``: 2-layer BERT hidden 64, 4-stage ResNet on 64x64
images, d = 128) trains on random captions and JPEGs. Each configuration runs in its own process, so its peak RSS
(``ru_maxrss``) is its own: one cached step at ``--batch`` rows in chunks of ``--chunk``, then plain steps at each
``--plain_batches`` size. The report gives the largest plain batch whose peak RSS fits in the cached run's (the
memory budget) and the per-example time ratio cached / plain. A plain run the machine cannot hold (killed, OOM)
counts as not fitting.

    .venv/bin/python -m benchmarks.scale.gradcache --batch 4096 --chunk 256 --plain_batches 256,512,1024,2048,4096
    .venv/bin/python -m benchmarks.scale.gradcache --batch 256 --chunk 64 --plain_batches 64,256 --steps 2  # smoke run

Measure alone on the machine (RSS and timings are shared-machine sensitive); one step's wall time on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time

from benchmarks import ROOT
from benchmarks.common.machine import run_module
from benchmarks.common.records import write_json

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow loads, whatever the import order below

WORDS = "a the red green blue yellow dog cat car tree grass street small big sky on in with left right of".split()
DEMO_CONFIG = os.path.join(ROOT, "configs", "synthetic_demo.yaml")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _batch(n: int, image_size: int, seed: int = 0) -> dict:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    caps = [" ".join(rng.choice(WORDS, size=12)) for _ in range(n)]
    images = [
        tf.io.encode_jpeg(rng.integers(0, 256, size=(image_size, image_size, 3), dtype=np.uint8)).numpy()
        for _ in range(64)
    ]
    imgs = [images[i % len(images)] for i in range(n)]
    ids = np.arange(n) % len(images)  # a few captions per image: positives beyond the diagonal
    return {"caption": tf.constant(caps), "image": tf.constant(imgs), "image_id": tf.constant(ids, tf.int64)}


def run_one(batch_size: int, chunk: int, steps: int) -> dict:
    """One configuration in this process: build, one traced step, then ``steps`` timed steps."""
    import tensorflow as tf

    import ce_retrieval  # noqa: F401
    from ce_retrieval.configs import load_experiment
    from ce_retrieval.tasks import RetrievalTask
    from ce_retrieval.utils.seeding import seed_everything

    seed_everything(0, deterministic=False)  # timings: no deterministic kernels
    cfg = load_experiment(DEMO_CONFIG)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "vocab.txt")
        with open(vocab, "w") as f:
            f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
        task = RetrievalTask(cfg)
        model = task.build_model(vocab)
    text_opt, image_opt = task.build_optimizers(1000)
    model.compile(
        loss=task.build_loss(), text_optimizer=text_opt, image_optimizer=image_opt, embedding_chunk=chunk or None
    )
    data = _batch(batch_size, cfg.model.image.image_size)
    rss_built = _rss_mb()
    start = time.perf_counter()
    model.train_on_batch(data)  # traces the step
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        logs = model.train_on_batch(data, return_dict=True)
        times.append(time.perf_counter() - start)
    step = statistics.median(times)
    return {
        "batch": batch_size,
        "chunk": chunk,
        "first_step_s": first,
        "step_s": step,
        "ms_per_example": 1e3 * step / batch_size,
        "peak_rss_mb": _rss_mb(),
        "rss_after_build_mb": rss_built,
        "loss": float(logs["loss"]),
        "threads": tf.config.threading.get_intra_op_parallelism_threads(),
    }


def _child(batch_size: int, chunk: int, steps: int) -> dict | None:
    proc = run_module(__spec__.name, "--_child", f"{batch_size},{chunk},{steps}")
    if proc.returncode != 0:
        print(f"  batch {batch_size} chunk {chunk}: failed (rc {proc.returncode}): {proc.stderr[-500:]}", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4096, help="global batch of the gradient-cached step")
    parser.add_argument("--chunk", type=int, default=256, help="train.embedding_chunk of the cached step")
    parser.add_argument("--plain_batches", default="256,512,1024,2048,4096", help="plain-step batches to compare")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per configuration (after one traced)")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    parser.add_argument("--_child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        batch_size, chunk, steps = (int(x) for x in args._child.split(","))
        print(json.dumps(run_one(batch_size, chunk, steps)))
        return {}

    print(f"gradient caching: batch {args.batch}, chunk {args.chunk}", flush=True)
    cached = _child(args.batch, args.chunk, args.steps)
    if cached is None:
        raise SystemExit("the gradient-cached run failed")
    print(f"  {json.dumps(cached)}", flush=True)
    plain = []
    for batch_size in sorted(int(b) for b in args.plain_batches.split(",") if b):
        print(f"plain step: batch {batch_size}", flush=True)
        result = _child(batch_size, 0, args.steps)
        if result is not None:
            print(f"  {json.dumps(result)}", flush=True)
            plain.append(result)
    fits = [p for p in plain if p["peak_rss_mb"] <= cached["peak_rss_mb"]]
    best = max(fits, key=lambda p: p["batch"]) if fits else None
    summary = {
        "cached": cached,
        "plain": plain,
        "budget_mb": cached["peak_rss_mb"],
        "largest_plain_batch_in_budget": best["batch"] if best else None,
        "time_per_example_ratio_cached_over_plain": {
            str(p["batch"]): cached["ms_per_example"] / p["ms_per_example"] for p in plain
        },
    }
    print("summary:", json.dumps(summary, indent=1))
    if args.out:
        out, name = os.path.split(os.path.splitext(args.out)[0])
        write_json(out, name, summary)
    return summary


if __name__ == "__main__":
    main()
