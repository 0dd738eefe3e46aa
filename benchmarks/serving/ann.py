"""ANN benchmark: ScaNN (as ``ce_retrieval.build.index`` builds it) vs exact NumPy search, faiss (HNSW, IVF)
and hnswlib on the same generated data, in the same process.

Data: N unit vectors in d = 128 around C random cluster centres (x = normalise(c + spread * g / sqrt(d))),
plus held-out queries from the same distribution. Ground truth: exact top-10 by inner product.
Reported per method and setting: recall@10, batched throughput (queries/s over all queries, all cores),
single-query latency (median / p99 of one-at-a-time calls) and build time. Ratios are against exact batched
search measured in this run (the figure that matters on a shared, noisy machine). Also: exact threshold search
with ball partitions vs brute force (fraction of dot products computed, speed-up).

    python -m benchmarks.serving.ann                 # N = 1,000,000 (about 10 minutes on 2 cores)
    python -m benchmarks.serving.ann --n 200000 --out benchmarks/results/ann_200k.json
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # ScaNN imports TensorFlow; keras-cv needs legacy Keras

import numpy as np  # noqa: E402
from scann.scann_ops.py import scann_ops_pybind  # noqa: E402,F401  (import before BLAS work; see gallery.py)

import ce_retrieval  # noqa: E402,F401  (legacy Keras before TensorFlow, which ScaNN imports)
from benchmarks.common.galleries import clustered  # noqa: E402
from benchmarks.common.machine import load_average  # noqa: E402
from benchmarks.common.records import write_record  # noqa: E402
from ce_retrieval.search.ann import IndexParams, build_scann, default_params  # noqa: E402
from ce_retrieval.search.exact import exact_search  # noqa: E402
from ce_retrieval.search.partitions import build_partitions, exact_threshold_search  # noqa: E402


def recall(found, truth):
    found = np.asarray(found)[:, : truth.shape[1]]
    return float(np.mean([len(np.intersect1d(a, b)) for a, b in zip(found, truth, strict=True)]) / truth.shape[1])


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def single_latency(fn, queries, num):
    times = []
    for q in queries[:num]:
        t = time.perf_counter()
        fn(q)
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times)), 1e3 * float(np.percentile(times, 99))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--spread", type=float, default=1.2)
    ap.add_argument("--single", type=int, default=200, help="queries timed one at a time")
    ap.add_argument("--skip", default="", help="comma list of methods to skip: hnsw_faiss,ivf_faiss,hnswlib")
    ap.add_argument("--out", default=None, help="write all figures as JSON here")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    load_start = load_average()
    rows, info = (
        [],
        {
            "n": args.n,
            "dim": args.dim,
            "queries": args.queries,
            "clusters": args.clusters,
            "spread": args.spread,
            "cpus": os.cpu_count(),
        },
    )

    data = clustered(
        args.n + args.queries,
        args.dim,
        args.clusters,
        0,
        spread=args.spread,
        draws="shared",
        scaled=True,
        chunk=100_000,
    )
    x, q = data[: args.n], data[args.n :]
    (truth, _), t_exact = timed(exact_search, q, x, 10)
    exact_qps = len(q) / t_exact
    exact_single = single_latency(lambda v: exact_search(v[None], x, 10), q, min(args.single, 50))
    rows.append(
        {
            "method": "exact numpy",
            "setting": "chunked matmul",
            "recall@10": 1.0,
            "qps": exact_qps,
            "p50_ms": exact_single[0],
            "p99_ms": exact_single[1],
            "build_s": 0.0,
        }
    )
    print(f"exact: {exact_qps:.1f} q/s batched", flush=True)

    p = default_params(args.n, IndexParams())
    searcher, t_build = timed(build_scann, x, p)
    info["scann_params"] = {
        "num_leaves": p.num_leaves,
        "reorder": p.reorder_num_neighbors,
        "training_sample_size": p.training_sample_size,
    }
    for leaves in sorted({max(1, round(p.num_leaves * f)) for f in (0.005, 0.01, 0.02, 0.04, 0.07, 0.1, 0.2, 0.3)}):
        for reorder in (p.reorder_num_neighbors, 4 * p.reorder_num_neighbors):  # the depths the index tunes over
            (found, _), t = timed(searcher.search_batched_parallel, q, 10, reorder, leaves)
            lat = single_latency(
                lambda v, leaves=leaves, reorder=reorder: searcher.search(v, 10, reorder, leaves), q, args.single
            )
            rows.append(
                {
                    "method": "scann (ce_retrieval index)",
                    "setting": f"leaves_to_search={leaves}/{p.num_leaves} reorder={reorder}",
                    "recall@10": recall(found, truth),
                    "qps": len(q) / t,
                    "p50_ms": lat[0],
                    "p99_ms": lat[1],
                    "build_s": t_build,
                }
            )
            print(rows[-1], flush=True)

    import faiss

    if "ivf_faiss" not in skip:
        nlist = p.num_leaves
        quant = faiss.IndexFlatIP(args.dim)
        ivf = faiss.IndexIVFFlat(quant, args.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        t0 = time.perf_counter()
        ivf.train(x[np.random.default_rng(0).choice(args.n, min(args.n, 100_000), replace=False)])
        ivf.add(x)
        t_ivf = time.perf_counter() - t0
        for nprobe in (4, 8, 16, 32, 64, 128):
            ivf.nprobe = nprobe
            (res, t) = timed(ivf.search, q, 10)
            lat = single_latency(lambda v: ivf.search(v[None], 10), q, args.single)
            rows.append(
                {
                    "method": "faiss IVFFlat",
                    "setting": f"nlist={nlist} nprobe={nprobe}",
                    "recall@10": recall(res[1], truth),
                    "qps": len(q) / t,
                    "p50_ms": lat[0],
                    "p99_ms": lat[1],
                    "build_s": t_ivf,
                }
            )
            print(rows[-1], flush=True)
    if "hnsw_faiss" not in skip:
        hnsw = faiss.IndexHNSWFlat(args.dim, 32, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = 80
        _, t_hnsw = timed(hnsw.add, x)
        for ef in (16, 32, 64, 128, 256):
            hnsw.hnsw.efSearch = ef
            (res, t) = timed(hnsw.search, q, 10)
            lat = single_latency(lambda v: hnsw.search(v[None], 10), q, args.single)
            rows.append(
                {
                    "method": "faiss HNSWFlat",
                    "setting": f"M=32 efC=80 efSearch={ef}",
                    "recall@10": recall(res[1], truth),
                    "qps": len(q) / t,
                    "p50_ms": lat[0],
                    "p99_ms": lat[1],
                    "build_s": t_hnsw,
                }
            )
            print(rows[-1], flush=True)
    if "hnswlib" not in skip:
        import hnswlib

        h = hnswlib.Index(space="ip", dim=args.dim)
        t0 = time.perf_counter()
        h.init_index(max_elements=args.n, ef_construction=80, M=16)
        h.add_items(x)
        t_h = time.perf_counter() - t0
        for ef in (16, 32, 64, 128, 256):
            h.set_ef(ef)
            (res, t) = timed(h.knn_query, q, 10)
            lat = single_latency(lambda v: h.knn_query(v[None], 10), q, args.single)
            rows.append(
                {
                    "method": "hnswlib",
                    "setting": f"M=16 efC=80 ef={ef}",
                    "recall@10": recall(res[0], truth),
                    "qps": len(q) / t,
                    "p50_ms": lat[0],
                    "p99_ms": lat[1],
                    "build_s": t_h,
                }
            )
            print(rows[-1], flush=True)

    # exact threshold search: ball partitions vs brute force, tau = each query's 100th best score (median)
    order, parts = build_partitions(x, p.num_leaves)
    xs = x[order]
    qs = q[:200]
    (_, s100), _ = timed(exact_search, qs, x, 100)
    tau = float(np.median(s100[:, -1]))
    (r_part, _, scored), t_part = timed(exact_threshold_search, qs, xs, tau, parts)
    (r_brute, _, _), t_brute = timed(exact_threshold_search, qs, xs, tau, None)
    assert [sorted(a.tolist()) for a in r_part] == [sorted(a.tolist()) for a in r_brute]
    info["threshold_search"] = {
        "tau": tau,
        "mean_hits": float(np.mean([len(a) for a in r_part])),
        "fraction_scored": scored / (len(qs) * len(x)),
        "speedup_vs_brute": t_brute / t_part,
    }

    for r in rows:
        r["qps_vs_exact"] = r["qps"] / exact_qps
    report = [
        f"N={args.n} d={args.dim} queries={args.queries} clusters={args.clusters} spread={args.spread}; "
        f"exact batched {exact_qps:.1f} q/s",
        "",
        "| method | setting | recall@10 | batched q/s | x exact | single p50 ms | p99 ms | build s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        report.append(
            f"| {r['method']} | {r['setting']} | {r['recall@10']:.4f} | {r['qps']:.0f} | {r['qps_vs_exact']:.0f} | "
            f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['build_s']:.1f} |"
        )
    print("\n" + "\n".join(report))
    best = {}
    for r in rows:
        if r["recall@10"] >= 0.95 and r["method"] != "exact numpy":
            best[r["method"]] = max(best.get(r["method"], 0.0), r["qps"])
    info["best_qps_at_recall_0.95"] = best
    print(f"\nbest batched q/s at recall@10 >= 0.95: {json.dumps({k: round(v) for k, v in best.items()})}")
    report += [
        "",
        f"Best batched q/s at recall@10 >= 0.95: {json.dumps({k: round(v) for k, v in best.items()})}.",
        f"Exact threshold search (tau={tau:.4f}, {info['threshold_search']['mean_hits']:.0f} hits/query): "
        f"{100 * info['threshold_search']['fraction_scored']:.1f}% of dot products, "
        f"{info['threshold_search']['speedup_vs_brute']:.2f}x brute force.",
    ]
    print("\n".join(report[-3:]))
    info["load_average_1_5_15"] = {"start": load_start, "end": load_average()}
    info["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    info["command"] = "python -m benchmarks.serving.ann " + " ".join(sys.argv[1:])
    if args.out:
        head = [
            f"# ANN search, N = {args.n:,} ({info['date']})",
            "",
            f"`{info['command']}`; {os.cpu_count()} CPUs; load average (1, 5, 15 min) at start {load_start}, "
            f"at end {info['load_average_1_5_15']['end']}.",
            "",
        ]
        out, name = os.path.split(os.path.splitext(args.out)[0])
        write_record(out, name, {"info": info, "rows": rows}, "\n".join(head + report) + "\n", echo=False)


if __name__ == "__main__":
    main()
