"""Beam gallery embedding benchmark: images/s of ``embed_gallery`` with 1 and 2 DirectRunner workers.

N synthetic images (``ce_retrieval.data.synthetic``, drawn at the export's training image size) are written once
as ``<id>.png`` files into a temporary folder; each configuration then runs ``embed_gallery`` on that folder in a
fresh Python process, so its peak RSS is its own (the driver's ``ru_maxrss``, and for multi_processing the
largest sampled total RSS of its worker processes). images/s is images / the pipeline's whole run (worker
start-up and model loading included). For scale, the first row calls the exported signature directly in one
process (no Beam; model loading and the first, tracing call excluded).

It needs a real export of the demo model: ``bash scripts/main.sh`` (the main job) writes one to
``runs/demo/export`` (or ``ce-retrieval export --model_dir D --export_dir E`` for a trained model). Run it alone:

    python -m benchmarks.serving.beam_embedding --export_dir runs/demo/export --num_images 2000 --workers 1,2
"""

import argparse
import json
import os
import resource
import shlex
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common.machine import load_average, run_module  # noqa: E402


class _WorkerRss:
    """Samples the RSS of this process's descendants (the SDK worker processes of multi_processing) every
    0.2 s; ``peak`` is the largest total seen, in MiB. (``RUSAGE_CHILDREN`` would instead report the parent's
    RSS at the moment of any fork.)"""

    def __init__(self):
        import psutil

        self.me, self.peak, self.stop = psutil.Process(), 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        import psutil

        while not self.stop.wait(0.2):
            total = 0
            for proc in self.me.children(recursive=True):
                try:
                    total += proc.memory_info().rss
                except psutil.Error:  # exited between listing and reading
                    pass
            self.peak = max(self.peak, total / 2**20)

    def finish(self) -> float:
        self.stop.set()
        self.thread.join()
        return self.peak


def _child(args) -> None:
    """One configuration, in this fresh process; prints one JSON line."""
    import numpy as np

    from ce_retrieval.build.pipeline import direct_runner_args, embed_gallery
    from ce_retrieval.search import layout

    workers_rss = _WorkerRss()
    if args.child_workers == 0:
        import tensorflow as tf

        from ce_retrieval.build.export import IMAGE_INPUT, load_signature

        names = sorted(os.listdir(args.child_images))
        images = [open(os.path.join(args.child_images, n), "rb").read() for n in names]
        _, fn = load_signature(layout.version_dir(args.export_dir, layout.IMAGE_ENCODER, args.version))
        fn(**{IMAGE_INPUT: tf.constant(images[: args.batch_size], dtype=tf.string)})  # warm-up: trace and allocate
        started = time.perf_counter()
        for i in range(0, len(images), args.batch_size):
            out = fn(**{IMAGE_INPUT: tf.constant(images[i : i + args.batch_size], dtype=tf.string)})["embedding"]
            np.asarray(out)
        seconds, count = time.perf_counter() - started, len(images)
    else:
        out_dir = os.path.join(args.child_out, f"workers-{args.child_workers}")
        started = time.perf_counter()
        manifest = embed_gallery(
            args.child_images,
            args.export_dir,
            out_dir,
            version=args.version,
            num_shards=args.num_shards,
            batch_size=args.batch_size,
            pipeline_args=direct_runner_args(args.child_workers, args.mode),
        )
        seconds, count = manifest["elapsed_seconds"], manifest["count"]
        print(f"wall {time.perf_counter() - started:.1f} s", file=sys.stderr)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB
    row = {"workers": args.child_workers, "count": count, "seconds": seconds, "rss": own, "child": workers_rss.finish()}
    print(json.dumps(row))


def _run_child(argv: list[str], workers: int, images: str, out: str) -> dict:
    flags = ["--child_workers", str(workers), "--child_images", images, "--child_out", out]
    proc = run_module(__spec__.name, *argv, *flags)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"configuration with {workers} workers failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--export_dir",
        required=True,
        help="an export of a trained model; `bash scripts/main.sh` writes the demo model's to runs/demo/export",
    )
    ap.add_argument("--version", type=int, default=None, help="export version (default: newest complete)")
    ap.add_argument("--num_images", type=int, default=2000)
    ap.add_argument("--workers", default="1,2", help="comma-separated DirectRunner worker counts")
    ap.add_argument("--mode", choices=("multi_processing", "multi_threading"), default="multi_processing")
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--num_shards", type=int, default=8)
    ap.add_argument("--no_direct", action="store_true", help="skip the no-Beam baseline row")
    ap.add_argument("--child_workers", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child_images", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child_out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    from ce_retrieval.search import layout

    args.export_dir = os.path.abspath(args.export_dir)
    complete = layout.complete_versions(args.export_dir)
    if not complete:
        raise SystemExit(
            f"error: {args.export_dir} holds no complete export; make one with `bash scripts/main.sh` "
            "(writes runs/demo/export) or `ce-retrieval export --model_dir D --export_dir E`"
        )
    args.version = args.version if args.version is not None else complete[-1]
    if args.child_workers is not None:
        _child(args)
        return

    from ce_retrieval.data.synthetic import generate_split

    meta = layout.export_metadata(args.export_dir, layout.IMAGE_ENCODER, args.version)
    data_cfg = ((meta.get("metadata") or {}).get("config") or {}).get("data") or {}
    image_size = int(data_cfg.get("image_size", 64))
    load_before = load_average()
    started = time.perf_counter()
    split = generate_split("test", args.num_images, captions_per_image=1, image_size=image_size, seed=123)
    generated = time.perf_counter() - started
    passthrough = ["--export_dir", args.export_dir, "--version", str(args.version), "--mode", args.mode]
    passthrough += ["--batch_size", str(args.batch_size), "--num_shards", str(args.num_shards)]
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="beam-embedding-") as tmp:
        images = os.path.join(tmp, "images")
        os.makedirs(images)
        for image_id, png in zip(split.image_ids.tolist(), split.images, strict=True):
            with open(os.path.join(images, f"{image_id}.png"), "wb") as f:
                f.write(png)
        for w in ([] if args.no_direct else [0]) + workers:
            rows.append(_run_child(passthrough, w, images, tmp))
            print(f"workers={w}: {rows[-1]}", file=sys.stderr, flush=True)
    load_after = load_average()

    print("\n### Beam gallery embedding (DirectRunner)\n")
    print(f"command: `python -m benchmarks.serving.beam_embedding {shlex.join(sys.argv[1:])}`  ")
    print(f"export: `{args.export_dir}` version {args.version} (d = {meta.get('embedding_dim')}), ", end="")
    print(f"N = {args.num_images} synthetic {image_size}x{image_size} PNGs (generated in {generated:.1f} s), ", end="")
    print(f"batch {args.batch_size}, {args.num_shards} shards, {os.cpu_count()} CPUs  ")
    print(f"load average before: {' / '.join(f'{x:.2f}' for x in load_before)}; ", end="")
    print(f"after: {' / '.join(f'{x:.2f}' for x in load_after)}\n")
    print("| run | workers | images | seconds | images/s | peak RSS driver (MiB) | peak RSS workers, total (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        name = "signature, no Beam" if r["workers"] == 0 else f"Beam {args.mode if r['workers'] > 1 else 'in-process'}"
        rate = r["count"] / r["seconds"] if r["seconds"] else float("nan")
        child = f"{r['child']:.0f}" if r["workers"] > 1 and args.mode == "multi_processing" else "-"
        print(
            f"| {name} | {r['workers'] or '-'} | {r['count']} | {r['seconds']:.1f} | {rate:.1f} | {r['rss']:.0f} | "
            f"{child} |"
        )


if __name__ == "__main__":
    main()
