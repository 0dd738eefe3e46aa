"""Threshold search methods compared in one process on the hard clustered gallery (issue #23).

Same gallery as ``benchmarks/serving/threshold_search.py`` (``hard_gallery``), queries from 2,000 other clusters (its
``other_clusters`` set; ``--query-set gallery_clusters``: new draws of the gallery's own clusters), tau at which
the median query has 100 hits, the index built by ``write_index_folder`` with defaults and no evaluation queries
(the build falls back to held-out-like points). Measured, interleaved round by round (so a
shared machine's load hits every method alike; compare the ratios, not the absolute rates):

* top-10 on the index (ScaNN), today's approximate threshold search (ScaNN top-k grown until the k-th exact
  score < tau, its grid-tuned parameters from the manifest), exact threshold search, a NumPy blocked scan;
* leaf probing (defined here; measured, not adopted: ``benchmarks/results/threshold_methods.md``): each query
  scores exactly every member of the index's k-means leaves with ``q.mu_l + beta sd_l(q) >= tau`` (``sd_l(q)``:
  the spread of q.x over the leaf from its top-8 principal axes), beta tuned on the build's own evaluation queries
  as a build would; one product per probed leaf (BLAS threads, or 2 threads of single-threaded BLAS), or the
  union of the probed leaves in one product.

Also, offline from the exact answers, for leaf rankings by the centre score alone and with spreads of rank 0
(isotropic), 4, 8, 16 (``--finer F``: and on F times more leaves), the share of the gallery a query must score to
reach set recall 0.99 / 0.995 / 0.999 on these queries (the best any beta of that ranking can do). ``--scann-grid``:
other (leaves_factor, reorder_factor) points of today's search: set recall, and speed against the tuned point
(interleaved, 2 runs each).

    python -m benchmarks.serving.threshold_methods --n 200000
    python -m benchmarks.serving.threshold_methods --n 1000000

Writes ``threshold_methods_<n>.json`` under ``--out`` (default ``benchmarks/results``) and prints a summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from benchmarks import RESULTS  # noqa: E402
from benchmarks.common.machine import host, load_average  # noqa: E402
from benchmarks.common.records import write_json  # noqa: E402
from benchmarks.serving.threshold_search import MODEL, QUERY_STREAM, SEED, hard_gallery, numpy_scan  # noqa: E402
from ce_retrieval.build.index import evaluation_queries, write_index_folder  # noqa: E402
from ce_retrieval.search.gallery import GalleryIndex  # noqa: E402  (imports ScaNN before BLAS work)
from ce_retrieval.search.partitions import BallPartitions, build_partitions, exact_threshold_search  # noqa: E402
from ce_retrieval.search.threshold import exact_sets, set_recall  # noqa: E402

# ----------------------------------------------------------------------------------------------- leaf probing
# A query probes every leaf l of the index's k-means partitions (gallery in leaf order) with
#     q.mu_l + beta sd_l(q) >= tau,   sd_l(q)^2 = |W_l q|^2 + res_l |q|^2  (the spread of q.x over the leaf:
# W_l its top-r principal axes scaled by sqrt(lambda_i - res_l), res_l the mean variance outside them; r = 0:
# isotropic; "centre": sd = 1, beta in score units) and scores every member of the probed leaves exactly.
# For each true hit the smallest beta probing its leaf is (tau - q.mu_l) / sd_l(q), so the beta reaching a set
# recall is a quantile of those over the hits.


def leaf_shapes(xs, offsets, means, rank):
    """``(W [L, r, d], res [L])`` of each leaf's covariance ``W W^T + res I``."""
    num, d = means.shape
    r = min(int(rank), d)
    w = np.zeros((num, r, d), np.float32)
    res = np.zeros(num, np.float32)
    for leaf in range(num):
        m = xs[offsets[leaf] : offsets[leaf + 1]] - means[leaf]
        lam, v = np.linalg.eigh((m.T @ m).astype(np.float64) / len(m))
        lam, v = np.maximum(lam[::-1], 0.0), v[:, ::-1]
        res[leaf] = lam[r:].sum() / max(d - r, 1)
        w[leaf] = np.sqrt(np.maximum(lam[:r] - res[leaf], 0.0))[:, None] * v[:, :r].T
    return w, res


class Shapes:
    def __init__(self, parts: BallPartitions, w: np.ndarray, res: np.ndarray):
        self.parts, self.w, self.res = parts, w, res

    def spread(self, q: np.ndarray) -> np.ndarray:
        num, r, d = self.w.shape
        proj = q @ self.w.reshape(num * r, d).T
        proj *= proj
        var = proj.reshape(len(q), num, r).sum(axis=2) + self.res[None, :] * np.sum(q * q, axis=1)[:, None]
        return np.sqrt(var)

    def mask(self, q: np.ndarray, tau: float, beta: float) -> np.ndarray:
        return q @ self.parts.centers.T + beta * self.spread(q) >= tau

    def needed_beta(self, q: np.ndarray, tau: float, truth: list[np.ndarray]) -> np.ndarray:
        qc, sd = q @ self.parts.centers.T, np.maximum(self.spread(q), 1e-12)
        out = []
        for i, rows in enumerate(truth):
            leaves = np.searchsorted(self.parts.offsets, rows, side="right") - 1
            out.append((tau - qc[i, leaves]) / sd[i, leaves])
        return np.concatenate(out)

    def scored_share(self, q: np.ndarray, tau: float, beta: float) -> float:
        """Mean share of the gallery a query scores when probing with ``beta``."""
        return float((self.mask(q, tau, beta) @ np.diff(self.parts.offsets)).mean() / self.parts.offsets[-1])


_POOL = None


def probe_search(shapes: Shapes, queries, xs, tau, beta, threads: int = 0):
    """Rows (per query) with q.x >= tau in the probed leaves: one product per probed leaf with the queries probing
    it (``threads`` > 0: the leaves split over that many threads, BLAS single-threaded in each)."""
    import concurrent.futures

    from threadpoolctl import threadpool_limits

    global _POOL
    parts = shapes.parts
    mask_t = np.ascontiguousarray(shapes.mask(queries, tau, beta).T)
    leaves = np.flatnonzero(mask_t.any(axis=1))

    def work(chunk):
        out = []
        for leaf in chunk:
            s, e = parts.offsets[leaf], parts.offsets[leaf + 1]
            qi = np.flatnonzero(mask_t[leaf])
            block = queries[qi] @ xs[s:e].T
            bi, ri = np.nonzero(block >= tau)
            out.append((qi[bi], ri + s, block[bi, ri]))
        return out

    if threads:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(threads)
        with threadpool_limits(1, user_api="blas"):
            got = [t for c in _POOL.map(work, np.array_split(leaves, threads * 4)) for t in c]
    else:
        got = work(leaves)
    hq = np.concatenate([t[0] for t in got])
    hr = np.concatenate([t[1] for t in got])
    hs = np.concatenate([t[2] for t in got])
    order = np.lexsort((hr, -hs, hq))
    hq, hr = hq[order], hr[order]
    bounds = np.searchsorted(hq, np.arange(len(queries) + 1))
    scored = int(mask_t.sum(axis=1) @ np.diff(parts.offsets))
    return [hr[bounds[i] : bounds[i + 1]] for i in range(len(queries))], scored


def scan_threads(queries, xs, tau, threads: int = 2, block: int = 16384):
    """The exact blocked scan with the blocks split over ``threads`` threads, BLAS single-threaded in each."""
    import concurrent.futures

    from threadpoolctl import threadpool_limits

    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ThreadPoolExecutor(threads)

    def work(starts):
        out = []
        for s in starts:
            qi, ri = np.nonzero(queries @ xs[s : s + block].T >= tau)
            out.append((qi, ri + s))
        return out

    with threadpool_limits(1, user_api="blas"):
        got = [t for c in _POOL.map(work, np.array_split(np.arange(0, len(xs), block), threads)) for t in c]
    hq = np.concatenate([t[0] for t in got])
    hr = np.concatenate([t[1] for t in got])
    order = np.argsort(hq, kind="stable")
    hq, hr = hq[order], hr[order]
    bounds = np.searchsorted(hq, np.arange(len(queries) + 1))
    return [np.sort(hr[bounds[i] : bounds[i + 1]]) for i in range(len(queries))]


def probe_union(shapes: Shapes, queries, xs, tau, beta):
    """The union of every query's probed leaves, gathered and scored for all queries (one large product)."""
    parts = shapes.parts
    leaves = np.flatnonzero(shapes.mask(queries, tau, beta).any(axis=0))
    rows = np.concatenate([np.arange(parts.offsets[i], parts.offsets[i + 1]) for i in leaves])
    found = [[] for _ in range(len(queries))]
    for s in range(0, len(rows), 65536):
        qi, ri = np.nonzero(queries @ xs[rows[s : s + 65536]].T >= tau)
        for i in np.unique(qi):
            found[i].append(rows[s : s + 65536][ri[qi == i]])
    return [np.concatenate(f) if f else np.zeros(0, np.int64) for f in found]


def _beta_row(shapes: Shapes, queries, tau, need) -> dict:
    row = {}
    for target in (0.99, 0.995, 0.999):
        beta = float(np.quantile(need, target, method="higher"))
        row[str(target)] = {"beta": beta, "scored_share": shapes.scored_share(queries, tau, beta)}
    return row


def offline_curves(xs, parts, queries, tau, truth, finer=()) -> dict:
    """Share of the gallery scored at the beta reaching set recall 0.99 / 0.995 / 0.999 on these queries, for each
    leaf ranking (an oracle beta: the best any beta of that ranking can do)."""
    out = {}
    for rank in (None, 0, 4, 8, 16):
        if rank is None:  # centre score alone: beta in score units
            shapes = Shapes(parts, np.zeros((parts.num_leaves, 0, xs.shape[1]), np.float32), np.ones(parts.num_leaves))
        else:
            shapes = Shapes(parts, *leaf_shapes(xs, parts.offsets, parts.centers, rank))
        name = "centre" if rank is None else f"rank{rank}"
        out[name] = _beta_row(shapes, queries, tau, shapes.needed_beta(queries, tau, truth))
        print(name, json.dumps(out[name]), flush=True)
    for mult in finer:  # finer leaves (rank 8): less of each probed leaf scored in vain, more leaves to rank
        order, p = build_partitions(xs, mult * parts.num_leaves)
        shapes = Shapes(p, *leaf_shapes(xs[order], p.offsets, p.centers, 8))
        inv = np.argsort(order)
        name = f"rank8_leaves_x{mult}"
        out[name] = _beta_row(shapes, queries, tau, shapes.needed_beta(queries, tau, [np.sort(inv[t]) for t in truth]))
        print(name, json.dumps(out[name]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-offline", action="store_true")
    ap.add_argument("--scann-grid", action="store_true")
    ap.add_argument("--finer", type=int, nargs="*", default=[], help="offline: leaves x these factors")
    ap.add_argument(
        "--query-set",
        choices=("other_clusters", "gallery_clusters"),
        default="other_clusters",
        help="queries from 2,000 other clusters (what the recorded runs used) or new draws of the gallery's own "
        "clusters (threshold_search.py's first set)",
    )
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    load = [load_average()]
    x = hard_gallery(args.n)
    if args.query_set == "other_clusters":
        queries = hard_gallery(args.queries, seed=SEED + 1)
    else:
        queries = hard_gallery(args.queries, stream=QUERY_STREAM)
    folder = tempfile.mkdtemp(dir=args.workdir, prefix="threshold_methods_")
    from ce_retrieval.search.exact import exact_search

    _, s100 = exact_search(queries, x, 100)
    tau = float(np.median(s100[:, -1]))
    t = time.perf_counter()
    manifest = write_index_folder(x, np.arange(args.n), folder, MODEL, version=1, thresholds={"0.9": tau})
    build_s = time.perf_counter() - t
    del x
    index = GalleryIndex.load(folder, expected_model=MODEL, mmap=True)
    xs = np.asarray(np.load(os.path.join(folder, "embeddings.npy")))
    parts = index.partitions
    truth = exact_sets(queries, xs, [tau])[0]
    hits = np.array([len(r) for r in truth])
    print(f"n={args.n} tau={tau:.4f} hits median {np.median(hits)} max {hits.max()} build {build_s:.1f}s", flush=True)
    print("today's params", manifest["threshold_search"]["approximate"]["params"], flush=True)
    print("scann params", manifest["params"], "recall@10", manifest["ann"]["recall_at_10"], flush=True)

    # beta as a build would tune it: its own evaluation queries, its thresholds
    approx = manifest["threshold_search"]["approximate"]
    build_q = evaluation_queries(xs, None, 0)[0][:200]
    taus = approx["thresholds"]
    build_truth = exact_sets(build_q, xs, list(taus.values()))
    shapes = Shapes(parts, *leaf_shapes(xs, parts.offsets, parts.centers, 8))
    need = [shapes.needed_beta(build_q, tv, tr) for tv, tr in zip(taus.values(), build_truth, strict=True)]
    # the beta a build would record: the largest per-threshold hit quantile at 0.99 (margin 1) / 0.995 (margin 0.5)
    betas = {m: max(float(np.quantile(v, 1 - m * 0.01, method="higher")) for v in need) for m in (1.0, 0.5)}
    print("tuned beta (margin 1.0, 0.5):", betas, flush=True)

    offline = {} if args.no_offline else offline_curves(xs, parts, queries, tau, truth, args.finer)

    beta = betas[0.5]
    methods = {
        "top10": lambda: index.topk(queries, 10),
        "approx_today": lambda: index.threshold_rows(queries, tau, exact=False)[0],
        "exact": lambda: index.threshold_rows(queries, tau, exact=True)[0],
        "numpy_scan": lambda: numpy_scan(queries, xs, tau),
        "exact_no_bounds": lambda: exact_threshold_search(queries, xs, tau, None)[0],
        "scan_threads": lambda: scan_threads(queries, xs, tau),
        "probe_pairs": lambda: probe_search(shapes, queries, xs, tau, beta)[0],
        "probe_pairs_threads": lambda: probe_search(shapes, queries, xs, tau, beta, threads=2)[0],
        "probe_union": lambda: probe_union(shapes, queries, xs, tau, beta),
    }
    times = {m: [] for m in methods}
    found = {}
    for _ in range(args.rounds):
        for m, fn in methods.items():
            t = time.perf_counter()
            found[m] = fn()
            times[m].append(time.perf_counter() - t)
    grid = []
    if args.scann_grid:  # other (leaves_factor, reorder_factor) points of today's search, timed against the tuned one
        import dataclasses

        base = index.threshold_params
        points = ((8, 16), (8, 32), (16, 32), (4, 32), (2, 32), (16, 16), (4, 16), (32, 8))
        for lf, rf in points:
            p = dataclasses.replace(base, leaves_factor=float(lf), reorder_factor=float(rf))
            el, el_base, got = [], [], None
            for _ in range(2):
                index.threshold_params = p
                t = time.perf_counter()
                got = index.threshold_rows(queries, tau, exact=False)[0]
                el.append(time.perf_counter() - t)
                index.threshold_params = base
                t = time.perf_counter()
                index.threshold_rows(queries, tau, exact=False)
                el_base.append(time.perf_counter() - t)
            rec = set_recall([np.sort(r) for r in got], truth)
            row = {"leaves_factor": lf, "reorder_factor": rf, "set_recall": rec}
            grid.append(row | {"speed_vs_tuned": float(np.median(el_base) / np.median(el))})
            print(grid[-1], flush=True)
        index.threshold_params = base
    load.append(load_average())
    qps = {m: len(queries) / float(np.median(v)) for m, v in times.items()}
    recall = {m: set_recall([np.sort(r) for r in found[m]], truth) for m in methods if m != "top10"}
    _, scored = probe_search(shapes, queries, xs, tau, beta)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": host(),  # platform, cpu_count, CPU model and flags, versions
        "load_average_1_5_15": {"start": load[0], "end": load[1]},
        "n": args.n,
        "tau": tau,
        "hits": {"median": float(np.median(hits)), "max": int(hits.max())},
        "build_seconds": round(build_s, 1),
        "today_params": approx["params"],
        "scann_params": manifest["params"],
        "betas": {str(k): v for k, v in betas.items()},
        "probe_scored_share": scored / (len(queries) * args.n),
        "queries_per_second": {m: round(v, 1) for m, v in qps.items()},
        "ratio_vs_top10": {m: round(v / qps["top10"], 3) for m, v in qps.items()},
        "ratio_vs_scan": {m: round(v / qps["numpy_scan"], 2) for m, v in qps.items()},
        "set_recall": recall,
        "offline": offline,
        "scann_grid": grid,
        "command": "python -m benchmarks.serving.threshold_methods " + " ".join(sys.argv[1:]),
    }
    shutil.rmtree(folder)
    print(json.dumps({k: result[k] for k in result if k != "offline"}, indent=1))
    write_json(args.out, f"threshold_methods_{args.n}", result)


if __name__ == "__main__":
    main()
