"""Threshold search benchmark (issue #23): approximate vs exact threshold queries vs top-10 vs a NumPy scan.

The hard gallery: N unit vectors (d = 128, default 1,000,000; ``--n 10000000``) from 2,000 overlapping,
anisotropic clusters: x = normalise(c_k + U_k (s * z) + noise), c_k a random centre, U_k a random [d, 16] basis
with scales s decaying from 1.5 to 0.1 (elongated clusters), isotropic noise of the centres' scale (neighbours
are mostly, not only, in the query's cluster). Fixed seed; generated in chunks. 200 held-out queries from the
same distribution (another seed). tau is chosen so the median query has 100 hits (exact scan); it is also given
to the index as its "calibrated" threshold for precision 0.9 (a stand-in level), so the manifest's set recall is
measured there (on the build's own held-out-like queries, not these).

The index is built by ``write_index_folder`` (what ``build_index`` writes into an export's version folder; here
without an export, under a stand-in model block) and loaded with ``GalleryIndex.load``, all defaults. Timed,
one process, queries in one batch, median of ``--repeats`` runs:

* top-10 on the index (ScaNN);
* ``threshold(q, tau)`` (default: approximate, as the manifest says) and its set recall vs the exact answer;
* ``threshold(q, tau, exact=True)``;
* a plain NumPy scan, ``q @ X.T >= tau`` in blocks of 65,536 rows.

    python benchmarks/threshold_search.py                 # 1M
    python benchmarks/threshold_search.py --n 10000000    # 10M (about 5 GB of embeddings)

Writes ``benchmarks/results/threshold_search_<n>.json`` and ``.md`` with the machine, load averages and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from ce_retrieval.serving.gallery import GalleryIndex  # noqa: E402  (imports ScaNN before BLAS work)
from ce_retrieval.serving.index import write_index_folder  # noqa: E402
from ce_retrieval.serving.threshold_search import set_recall  # noqa: E402

DIM, CLUSTERS, RANK, CHUNK, SEED = 128, 2000, 16, 32_768, 23  # a chunk gathers [CHUNK, d, RANK] bases: 270 MB
MODEL = {"fingerprint": "benchmark", "export_id": "benchmark", "embedding_dim": DIM, "normalization": "l2"}


def hard_gallery(n: int, seed: int = SEED, start: int = 0) -> np.ndarray:
    """Rows ``start:start+n`` of the hard clustered gallery (float32 unit vectors; deterministic per chunk)."""
    g = np.random.default_rng(seed)
    centers = g.normal(size=(CLUSTERS, DIM)).astype(np.float32)
    bases = g.normal(size=(CLUSTERS, DIM, RANK)).astype(np.float32) / np.sqrt(DIM)
    scales = np.geomspace(1.5, 0.1, RANK).astype(np.float32)
    out = np.empty((n, DIM), np.float32)
    for s in range(0, n, CHUNK):
        rows = min(CHUNK, n - s)
        rng = np.random.default_rng([seed, start + s])
        k = rng.integers(0, CLUSTERS, rows)
        z = rng.standard_normal((rows, RANK), dtype=np.float32) * scales
        x = centers[k] + np.einsum("ndr,nr->nd", bases[k], z) * np.sqrt(DIM)
        x += rng.standard_normal((rows, DIM), dtype=np.float32)
        out[s : s + rows] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def numpy_scan(q: np.ndarray, x: np.ndarray, tau: float) -> list[np.ndarray]:
    """The baseline: rows with q.x >= tau by blocked matrix products."""
    found = [[] for _ in range(len(q))]
    for s in range(0, len(x), 65536):
        qi, ri = np.nonzero(q @ x[s : s + 65536].T >= tau)
        for i in np.unique(qi):
            found[i].append(ri[qi == i] + s)
    return [np.sort(np.concatenate(f)) if f else np.zeros(0, np.int64) for f in found]


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), out


def run(n: int, num_queries: int, repeats: int, workdir: str) -> dict:
    load = [os.getloadavg()]
    t = time.perf_counter()
    x = hard_gallery(n)
    queries = hard_gallery(num_queries, seed=SEED + 1)
    gen_s = time.perf_counter() - t
    from ce_retrieval.evaluation.search import exact_search

    _, s100 = exact_search(queries, x, 100)
    tau = float(np.median(s100[:, -1]))
    truth = numpy_scan(queries, x, tau)
    folder = tempfile.mkdtemp(dir=workdir, prefix="threshold_search_")  # removed at the end
    t = time.perf_counter()
    stand_in = {"0.9": tau}  # a stand-in calibrated level
    manifest = write_index_folder(x, np.arange(n), folder, MODEL, version=1, thresholds=stand_in)
    build_s = time.perf_counter() - t
    del x
    index = GalleryIndex.load(folder, expected_model=MODEL, mmap=True)
    xs = np.load(os.path.join(folder, "embeddings.npy"), mmap_mode="r")
    load.append(os.getloadavg())
    topk_s, _ = timed(lambda: index.topk(queries, 10), repeats)
    approx_s, (ids, _) = timed(lambda: index.threshold(queries, tau), repeats)
    exact_s, (eids, _) = timed(lambda: index.threshold(queries, tau, exact=True), repeats)
    scan_s, scan_rows = timed(lambda: numpy_scan(queries, np.asarray(xs), tau), repeats)
    load.append(os.getloadavg())
    recall = set_recall([np.sort(i) for i in ids], truth)
    exact_equal = all(np.array_equal(np.sort(e), t) for e, t in zip(eids, truth, strict=True))
    scan_equal = all(np.array_equal(np.sort(index.ids[r]), t) for r, t in zip(scan_rows, truth, strict=True))
    b = len(queries)
    hits = np.array([len(t) for t in truth])
    qps = {
        "top10": b / topk_s,
        "threshold_approximate": b / approx_s,
        "threshold_exact": b / exact_s,
        "numpy_scan": b / scan_s,
    }
    ts = manifest["threshold_search"]
    shutil.rmtree(folder)  # the memory maps stay valid after the files are unlinked (POSIX)
    return {
        "benchmark": "threshold_search",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "load_average_1_5_15": {"start": load[0], "after_build": load[1], "end": load[2]},
        "n": n,
        "dim": DIM,
        "num_queries": b,
        "tau": tau,
        "hits": {"median": float(np.median(hits)), "mean": float(hits.mean()), "max": int(hits.max())},
        "generate_seconds": round(gen_s, 2),
        "build_seconds": round(build_s, 2),
        "queries_per_second": {k: round(v, 1) for k, v in qps.items()},
        "ratios": {
            "threshold_vs_top10": round(qps["threshold_approximate"] / qps["top10"], 3),
            "threshold_vs_scan": round(qps["threshold_approximate"] / qps["numpy_scan"], 2),
            "exact_vs_scan": round(qps["threshold_exact"] / qps["numpy_scan"], 2),
        },
        "set_recall_held_out": recall,
        "exact_equals_scan": bool(exact_equal and scan_equal),
        "manifest_threshold_search": {k: ts[k] for k in ("method", "default")}
        | {k: ts.get("approximate", {}).get(k) for k in ("params", "set_recall", "meets_target", "num_queries")},
        "recall_at_10": manifest["ann"]["recall_at_10"],
    }


def markdown(r: dict, command: str) -> str:
    q = r["queries_per_second"]
    lines = [
        f"# Threshold search, {r['n']:,} x {r['dim']} hard clustered gallery ({r['date']})",
        "",
        f"`{command}`; {r['machine']['cpus']} CPUs, {r['machine']['platform']}; load average (1, 5, 15 min) "
        f"at start {r['load_average_1_5_15']['start']}, after build {r['load_average_1_5_15']['after_build']}, "
        f"at end {r['load_average_1_5_15']['end']}.",
        "",
        f"tau = {r['tau']:.4f} (median query {r['hits']['median']:.0f} hits, mean {r['hits']['mean']:.1f}, "
        f"max {r['hits']['max']}); {r['num_queries']} held-out queries in one batch; build {r['build_seconds']} s.",
        "",
        "| query | queries/s |",
        "|---|---:|",
        f"| top-10 on the index | {q['top10']:,.1f} |",
        f"| `threshold(q, tau)` (approximate, the default) | {q['threshold_approximate']:,.1f} |",
        f"| `threshold(q, tau, exact=True)` | {q['threshold_exact']:,.1f} |",
        f"| NumPy scan `q @ X.T >= tau` in blocks | {q['numpy_scan']:,.1f} |",
        "",
        f"Set recall of the approximate answer on these queries: {r['set_recall_held_out']:.4f} "
        f"(manifest, build queries: {r['manifest_threshold_search']['set_recall']}); exact mode equals the scan: "
        f"{r['exact_equals_scan']}. Ratios: threshold/top-10 {r['ratios']['threshold_vs_top10']}, "
        f"threshold/scan {r['ratios']['threshold_vs_scan']}, exact/scan {r['ratios']['exact_vs_scan']}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    r = run(args.n, args.queries, args.repeats, args.workdir)
    command = "python benchmarks/threshold_search.py " + " ".join(sys.argv[1:])
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"threshold_search_{args.n}")
    with open(base + ".json", "w", encoding="utf-8") as f:
        json.dump(r | {"command": command}, f, indent=1)
    text = markdown(r, command)
    with open(base + ".md", "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
