"""Service benchmark: latency percentiles and requests/s of ``ce-retrieval serve`` on loopback.

Concurrent clients (threads, one keep-alive connection each) post ``{"texts": [one caption], "k": 10}`` for a
fixed duration against a 100k-item gallery (ScaNN index). Baseline in the same process: the same searches
called directly on the ``Searcher`` (no HTTP), so the ratio shows what the HTTP layer costs.
With ``--export_dir`` an existing export is used; by default a throw-away export is made of a small hashed
bag-of-words text tower (d = 128) and a gallery of generated unit vectors.

    python -m benchmarks.serving.service --gallery 100000 --clients 4 --duration 20
"""

import argparse
import os
import tempfile
import threading
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import httpx  # noqa: E402
import numpy as np  # noqa: E402

import ce_retrieval  # noqa: E402,F401
from benchmarks.common.exports import stand_in_export  # noqa: E402
from benchmarks.common.galleries import clustered  # noqa: E402
from ce_retrieval.build.index import build_index  # noqa: E402
from ce_retrieval.serve.searcher import Searcher  # noqa: E402
from ce_retrieval.serve.service import create_app, serve_in_thread  # noqa: E402

WORDS = (
    "a the dog cat man woman child red blue green runs sits stands on under near big small tree car beach city street"
).split()


def make_export(root, gallery, seed=0):
    """The stand-in towers exported to ``root`` and indexed over a generated gallery of ``gallery`` items (200
    clusters, d = 128)."""
    stand_in_export(root)
    x = clustered(gallery, 128, 200, seed, spread=2.0, draws="shared")
    m = build_index(x, np.arange(gallery), root, 1, thresholds={"0.5": 0.3, "0.8": 0.5, "0.9": 0.6})
    print(f"index: {m['kind']}, recall@10 {m['ann']['recall_at_10']:.3f}, build {m['build_seconds']:.1f} s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export_dir", default=None)
    ap.add_argument("--gallery", type=int, default=100_000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load (bounded)")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    captions = [" ".join(rng.choice(WORDS, size=rng.integers(3, 9))) for _ in range(2000)]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.export_dir or tmp
        if args.export_dir is None:
            make_export(root, args.gallery)
        searcher = Searcher.load(root)
        for c in captions[:50]:
            searcher.search([c], k=10)  # warm up
        direct, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < min(5.0, args.duration / 2):
            t = time.perf_counter()
            searcher.search([captions[len(direct) % len(captions)]], k=10)
            direct.append(time.perf_counter() - t)
        direct_rps = len(direct) / (time.perf_counter() - t0)

        app = create_app(root, reload_interval_s=0, max_concurrency=max(2, args.clients))
        lat, errors, stop = [], [], threading.Event()
        with serve_in_thread(app) as url:

            def client(i):
                with httpx.Client(base_url=url, timeout=30) as c:
                    j = i
                    while not stop.is_set():
                        t = time.perf_counter()
                        r = c.post("/search", json={"texts": [captions[j % len(captions)]], "k": 10})
                        (lat if r.status_code == 200 else errors).append(time.perf_counter() - t)
                        j += args.clients

            with httpx.Client(base_url=url) as c:
                for cap in captions[:20]:
                    c.post("/search", json={"texts": [cap], "k": 10})
            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            t0 = time.perf_counter()
            for th in threads:
                th.start()
            time.sleep(args.duration)
            stop.set()
            for th in threads:
                th.join(timeout=60)
            elapsed = time.perf_counter() - t0
    lat_ms = 1e3 * np.array(lat)
    d_ms = 1e3 * np.array(direct)
    rps = len(lat) / elapsed
    print(f"\ngallery {args.gallery}, {args.clients} concurrent clients, {elapsed:.1f} s, CPUs {os.cpu_count()}")
    print("| path | requests/s | p50 ms | p90 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|")
    print(
        f"| direct Searcher.search (1 thread, baseline) | {direct_rps:.0f} | {np.percentile(d_ms, 50):.2f} | "
        f"{np.percentile(d_ms, 90):.2f} | {np.percentile(d_ms, 99):.2f} | 0 |"
    )
    print(
        f"| HTTP POST /search (loopback) | {rps:.0f} | {np.percentile(lat_ms, 50):.2f} | "
        f"{np.percentile(lat_ms, 90):.2f} | "
        f"{np.percentile(lat_ms, 99):.2f} | {len(errors)} |"
    )
    print(f"HTTP/direct throughput ratio {rps / direct_rps:.2f}")


if __name__ == "__main__":
    main()
