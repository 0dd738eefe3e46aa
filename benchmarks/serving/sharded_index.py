"""Sharded gallery index benchmark (issue #14): one index vs S shards on a generated gallery, and the router.

Parts, each run in a child process of its own so that its peak memory is its own (``ru_maxrss``, children
included for the sharded build's worker pool):

* ``prepare``  a clustered gallery of N unit vectors (d = 128; 2,000 Gaussian clusters, isotropic noise of the
  centres' scale: neighbours are mostly, not only, in the query's cluster), 1,000 held-out queries from the same
  distribution and their exact top-10 over the gallery (part ``queries``: chunked float32 matmul); two throw-away
  exports of a small hashed bag-of-words text tower (d = 128);
* ``single``   ``build_index`` of the whole gallery (one ScaNN index);
* ``sharded``  ``build_sharded_index`` with S shards and W build processes;
* ``search``   recall@10 of both against exact search on the held-out queries; in-process latency of one query
  at a time (``GalleryIndex.topk`` vs ``ShardedIndex.topk``); then HTTP: ``ce-retrieval serve`` over the one
  index vs the router ``serve --shard_urls`` in front of S ``serve-shard`` processes (one BLAS thread each), all
  on 127.0.0.1, at concurrency 1 and 8, posting one caption with k = 10 for a fixed time;
* ``leaves``   recall@10 and in-process latency of both at equal work (the same fraction of leaves searched).

    python -m benchmarks.serving.sharded_index --n 10000000 --shards 8 --workers 2 --workdir /tmp/ce_sharded_bench

Prints a markdown record (command, load average, machine) for ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from benchmarks.common.galleries import clustered  # noqa: E402
from benchmarks.common.machine import load_average, run_module  # noqa: E402

DIM, CLUSTERS, NOISE, CHUNK = 128, 2000, 1.0, 500_000
EXACT_CHUNK = 100_000  # rows per exact-search block: a [queries, EXACT_CHUNK] float32 score block
THRESHOLDS = {"0.5": 0.3, "0.8": 0.5, "0.9": 0.6}


def _peak_mb(children: bool = False) -> float:
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if children else 0
    return max(self_kb, kids_kb) / 1024.0


def _exact_top10(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    best_s = np.full((len(q), 10), -np.inf, np.float32)
    best_i = np.zeros((len(q), 10), np.int64)
    for start in range(0, len(x), EXACT_CHUNK):
        s = q @ np.asarray(x[start : start + EXACT_CHUNK]).T
        top = np.argpartition(-s, 10, axis=1)[:, :10]
        cand_s = np.concatenate([best_s, np.take_along_axis(s, top, 1)], axis=1)
        cand_i = np.concatenate([best_i, top + start], axis=1)
        order = np.argsort(-cand_s, axis=1)[:, :10]
        best_s, best_i = np.take_along_axis(cand_s, order, 1), np.take_along_axis(cand_i, order, 1)
    return best_i


def part_prepare(args) -> dict:
    from benchmarks.common.exports import stand_in_export  # imports TensorFlow: only in this part's process

    w = args.workdir
    os.makedirs(w, exist_ok=True)
    t = time.perf_counter()
    x = np.lib.format.open_memmap(os.path.join(w, "gallery.npy"), "w+", np.float32, (args.n, DIM))
    clustered(args.n, DIM, CLUSTERS, args.seed, spread=NOISE, chunk=CHUNK, out=x)
    x.flush()
    gen_s = time.perf_counter() - t
    for name in ("single", "sharded"):
        shutil.rmtree(os.path.join(w, name), ignore_errors=True)
        stand_in_export(os.path.join(w, name))
    return dict(part_queries(args), generate_s=gen_s, peak_mb=_peak_mb())


def part_queries(args) -> dict:
    """Held-out queries: new draws around the gallery's own centres, and their exact top-10 over the gallery."""
    w = args.workdir
    q = clustered(args.queries, DIM, CLUSTERS, args.seed, spread=NOISE, start=2**32 - 1)  # a key no gallery chunk uses
    t = time.perf_counter()
    truth = _exact_top10(np.load(os.path.join(w, "gallery.npy"), mmap_mode="r"), q)
    np.save(os.path.join(w, "queries.npy"), q)
    np.save(os.path.join(w, "truth.npy"), truth)
    return {"exact_top10_s": time.perf_counter() - t}


def _load_gallery(w: str) -> np.ndarray:
    # memory-mapped: the builds copy what they keep, so the input's pages stay reclaimable page cache
    return np.load(os.path.join(w, "gallery.npy"), mmap_mode="r")


def part_single(args) -> dict:
    from ce_retrieval.build.index import build_index

    x = _load_gallery(args.workdir)
    base = _peak_mb()
    t = time.perf_counter()
    m = build_index(x, np.arange(len(x)), os.path.join(args.workdir, "single"), 1, thresholds=THRESHOLDS)
    return {
        "build_s": time.perf_counter() - t,
        "peak_mb": _peak_mb(),
        "peak_before_build_mb": base,
        "build_recall_at_10": m["ann"]["recall_at_10"],
        "params": m["params"],
    }


def part_sharded(args) -> dict:
    from ce_retrieval.build.sharded import build_sharded_index

    x = _load_gallery(args.workdir)
    base = _peak_mb()
    t = time.perf_counter()
    m = build_sharded_index(
        x,
        np.arange(len(x)),
        os.path.join(args.workdir, "sharded"),
        1,
        num_shards=args.shards,
        workers=args.workers,
        thresholds=THRESHOLDS,
    )
    return {
        "build_s": time.perf_counter() - t,
        "peak_mb": _peak_mb(),
        "peak_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0,
        "peak_before_build_mb": base,
        "build_recall_at_10": m["ann"]["recall_at_10"],
        "shards": [{k: s[k] for k in ("name", "num_items", "recall_at_10", "build_seconds")} for s in m["shards"]],
    }


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(np.intersect1d(a[:10], b)) / 10.0 for a, b in zip(found, truth, strict=True)]))


def _latencies(fn, queries: np.ndarray, seconds: float) -> np.ndarray:
    out, t0, i = [], time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        t = time.perf_counter()
        fn(queries[i % len(queries)][None, :])
        out.append(time.perf_counter() - t)
        i += 1
    return np.array(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, timeout_s: float = 600.0) -> None:
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not become healthy")


def _http_load(url: str, captions: list[str], clients: int, seconds: float) -> dict:
    import httpx

    lat, errors, partial, stop = [], [], [], threading.Event()

    def client(i):
        with httpx.Client(base_url=url, timeout=30) as c:
            j = i
            while not stop.is_set():
                t = time.perf_counter()
                r = c.post("/search", json={"texts": [captions[j % len(captions)]], "k": 10})
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t)
                    if r.json().get("partial"):
                        partial.append(1)
                else:
                    errors.append(r.status_code)
                j += clients

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in threads:
        th.join(timeout=60)
    ms = 1e3 * np.array(lat)
    return {
        "clients": clients,
        "requests_per_s": len(lat) / (time.perf_counter() - t0),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "errors": len(errors),
        "partial": len(partial),
    }


def part_search(args) -> dict:
    from ce_retrieval.search.gallery import GalleryIndex
    from ce_retrieval.search.sharded import load_index
    from ce_retrieval.serve.service import create_app, serve_in_thread

    w = args.workdir
    q, truth = np.load(os.path.join(w, "queries.npy")), np.load(os.path.join(w, "truth.npy"))
    single = GalleryIndex.load(os.path.join(w, "single", "index", "1"), mmap=True)
    sharded = load_index(os.path.join(w, "sharded", "index", "1"), mmap=True)
    out = {}
    for name, index in (("single", single), ("sharded", sharded)):
        ids, _ = index.topk(q, 10)
        rows = np.asarray(ids)  # gallery ids are row numbers (np.arange)
        out[f"{name}_recall_at_10"] = _recall(rows, truth)
        index.topk(q[:20], 10)  # warm up
        ms = 1e3 * _latencies(lambda v, index=index: index.topk(v, 10), q, args.seconds)
        out[f"{name}_inprocess"] = {
            "queries_per_s": len(ms) / (ms.sum() / 1e3),
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
        }
    del single, sharded

    rng = np.random.default_rng(1)
    words = "a the dog cat man woman child red blue green runs sits on under near big small tree car beach".split()
    captions = [" ".join(rng.choice(words, size=rng.integers(3, 9))) for _ in range(2000)]
    # One BLAS/TensorFlow thread per shard server: S servers share this machine's cores (in production each has a
    # machine of its own), and idle OpenBLAS threads spinning in S processes would measure the contention.
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    procs, urls = [], []
    try:
        for i in range(args.shards):
            port = _free_port()
            cmd = [sys.executable, "-m", "ce_retrieval.cli", "serve-shard", "--export_dir", os.path.join(w, "sharded")]
            cmd += ["--shard", str(i), "--port", str(port), "--reload_interval", "0"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            _wait_healthy(url)
        shard_rss = []
        for p in procs:
            with open(f"/proc/{p.pid}/status") as f:
                shard_rss += [int(line.split()[1]) / 1024.0 for line in f if line.startswith("VmRSS")]
        out["shard_server_rss_mb"] = shard_rss
        for name, app_kwargs in (
            ("single", {"export_dir": os.path.join(w, "single")}),
            ("router", {"export_dir": os.path.join(w, "sharded"), "shard_urls": urls, "shard_timeout_s": 5.0}),
        ):
            app = create_app(reload_interval_s=0, max_concurrency=8, timeout_s=30.0, **app_kwargs)
            with serve_in_thread(app, startup_timeout_s=600) as url:
                _http_load(url, captions, 2, 3.0)  # warm up
                out[f"{name}_http"] = [_http_load(url, captions, c, args.seconds) for c in (1, 8)]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return out


def part_leaves(args) -> dict:
    """Recall@10 and one-query latency in-process at equal work: both indexes searching the same fraction of their
    leaves (the sharded one in every shard), 1 % to 8 %."""
    from ce_retrieval.search.gallery import GalleryIndex
    from ce_retrieval.search.sharded import load_index

    w = args.workdir
    q, truth = np.load(os.path.join(w, "queries.npy")), np.load(os.path.join(w, "truth.npy"))
    single = GalleryIndex.load(os.path.join(w, "single", "index", "1"), mmap=True)
    sharded = load_index(os.path.join(w, "sharded", "index", "1"), mmap=True)
    rows = []
    for fraction in (0.01, 0.02, 0.04, 0.08):
        row = {"fraction": fraction}
        for name, index in (("single", single), ("sharded", sharded)):
            first = index if name == "single" else index.shards[0]
            leaves = max(1, round(fraction * first.manifest["params"]["num_leaves"]))
            ids, _ = index.topk(q, 10, leaves_to_search=leaves)
            ms = 1e3 * _latencies(lambda v, i=index, n=leaves: i.topk(v, 10, leaves_to_search=n), q, args.seconds / 4)
            row[name] = {
                "leaves": leaves,
                "recall_at_10": _recall(np.asarray(ids), truth),
                "queries_per_s": len(ms) / (ms.sum() / 1e3),
                "p50_ms": float(np.percentile(ms, 50)),
                "p99_ms": float(np.percentile(ms, 99)),
            }
        rows.append(row)
    return {"rows": rows}


PARTS = {
    "prepare": part_prepare,
    "queries": part_queries,
    "single": part_single,
    "sharded": part_sharded,
    "search": part_search,
    "leaves": part_leaves,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=15.0, help="duration of each latency measurement")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="/tmp/ce_sharded_bench")
    ap.add_argument("--parts", default="prepare,single,sharded,search,leaves")
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)  # a child process runs one part
    args = ap.parse_args()
    if args.part:
        result = PARTS[args.part](args)
        print("RESULT " + json.dumps(result), flush=True)
        return
    results, load = {}, [load_average()]
    for part in args.parts.split(","):
        argv = [f"--{k}={v}" for k, v in vars(args).items() if k not in ("parts", "part")]
        t = time.perf_counter()
        done = run_module(__spec__.name, *argv, "--part", part)
        if done.returncode != 0:
            sys.exit(f"part {part} failed:\n{done.stderr[-3000:]}")
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
        results[part] = json.loads(line[len("RESULT ") :])
        results[part]["wall_s"] = time.perf_counter() - t
        load.append(load_average())
        print(f"{part}: {results[part]}", file=sys.stderr, flush=True)
    print(json.dumps({"args": vars(args), "load": load, "cpus": os.cpu_count(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
