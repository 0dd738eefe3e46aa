"""Threshold search benchmark (issue #23): approximate vs exact threshold queries vs top-k vs a NumPy scan.

The hard gallery: N unit vectors (d = 128, default 1,000,000; ``--n 10000000``) from 2,000 overlapping,
anisotropic clusters: x = normalise(c_k + U_k (s * z) + noise), c_k a random centre, U_k a random [d, 16] basis
with scales s decaying from 1.5 to 0.1 (elongated clusters), isotropic noise of the centres' scale (neighbours
are mostly, not only, in the query's cluster). Fixed seed; generated in chunks. Two sets of 200 timed queries:

* ``gallery_clusters`` (the issue's setting): fresh draws from the gallery's own clusters (another sample stream
  of the same generator). The build gets 1,000 more such draws as its validation queries (what ``ce-retrieval
  index`` passes: the validation captions) and a stand-in calibrated threshold for precision 0.9: tau at which
  the median validation query has 100 hits. The timed queries are asked at that tau.
* ``other_clusters``: draws from 2,000 *other* clusters (the generator with another seed), a query distribution
  unlike the gallery's and unlike the build's validation queries (a stress case, e.g. a modality gap larger than
  the validation set shows), at their own median-100-hits tau.

The index is built by ``write_index_folder`` (what ``build_index`` writes into an export's version folder; here
without an export, under a stand-in model block) and loaded with ``GalleryIndex.load``, all defaults. Timed per
query set, one process, queries in one batch, median of ``--repeats`` runs:

* top-10 on the index (ScaNN), with its recall@10;
* top-100 at the approximate threshold search's tuned leaves and re-scoring (what one round of a threshold
  query costs at k = 100, the median hits), with its recall@100;
* ``threshold(q, tau)`` (default: approximate, as the manifest says) and its set recall vs the exact answer;
* ``threshold(q, tau, exact=True)``;
* a plain NumPy scan, ``q @ X.T >= tau`` in blocks of 65,536 rows.

    python benchmarks/threshold_search.py                        # 1M
    python benchmarks/threshold_search.py --n 10000000 --keep    # 10M (about 5 GB of embeddings)

Writes ``benchmarks/results/threshold_search_<n>.json`` and ``.md`` with the machine (CPU model, cores), load
averages and date. The JSON is written after the build and after each timed query (``"complete": false`` until
the end), so an interrupted run keeps what it measured; with ``--keep`` the built index stays in
``WORKDIR/threshold_search_<n>/`` and a re-run with ``--keep`` reuses it instead of generating and building again.

Memory: the gallery is generated into a memory-mapped ``.npy`` in WORKDIR and handed to ``write_index_folder`` as
it is, so its pages are file-backed (the kernel can drop them) instead of an anonymous copy held beside the build's
own leaf-ordered copy; the build's peak (that copy, ScaNN while it is built and once more when the folder is
loaded back) is what remains. Measured at 400k (peak RssAnon, sampled): 1.25 GB before this change, 1.05 GB after
(one gallery copy less); at 10M x 128 that copy is 5.1 GB. Disk: the gallery (5.1 GB at 10M, removed after the
build) and the index (~11 GB).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from benchmarks.record_files import write_json, write_record  # noqa: E402
from ce_retrieval.serving.gallery import GalleryIndex  # noqa: E402  (imports ScaNN before BLAS work)
from ce_retrieval.serving.index import write_index_folder  # noqa: E402
from ce_retrieval.serving.threshold_search import scann_leaves, set_recall  # noqa: E402

DIM, CLUSTERS, RANK, CHUNK, SEED = 128, 2000, 16, 32_768, 23  # a chunk gathers [CHUNK, d, RANK] bases: 270 MB
QUERY_STREAM, VALIDATION_STREAM, VALIDATION_QUERIES = 1, 2, 1000
MODEL = {"fingerprint": "benchmark", "export_id": "benchmark", "embedding_dim": DIM, "normalization": "l2"}


def hard_gallery(
    n: int, seed: int = SEED, start: int = 0, out: np.ndarray | None = None, stream: int = 0
) -> np.ndarray:
    """Rows ``start:start+n`` of the hard clustered gallery (float32 unit vectors; deterministic per chunk), written
    into ``out`` when given (e.g. a memory-mapped ``.npy``: the gallery then never sits in anonymous memory).
    ``seed`` fixes the clusters and the sample stream; ``stream`` > 0 draws other samples of the same clusters
    (held-out queries: ``QUERY_STREAM``, ``VALIDATION_STREAM``)."""
    g = np.random.default_rng(seed)
    centers = g.normal(size=(CLUSTERS, DIM)).astype(np.float32)
    bases = g.normal(size=(CLUSTERS, DIM, RANK)).astype(np.float32) / np.sqrt(DIM)
    scales = np.geomspace(1.5, 0.1, RANK).astype(np.float32)
    out = np.empty((n, DIM), np.float32) if out is None else out
    for s in range(0, n, CHUNK):
        rows = min(CHUNK, n - s)
        rng = np.random.default_rng([seed, start + s] + ([stream] if stream else []))
        k = rng.integers(0, CLUSTERS, rows)
        z = rng.standard_normal((rows, RANK), dtype=np.float32) * scales
        x = centers[k] + np.einsum("ndr,nr->nd", bases[k], z) * np.sqrt(DIM)
        x += rng.standard_normal((rows, DIM), dtype=np.float32)
        out[s : s + rows] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def hard_gallery_labels(n: int, seed: int = SEED, stream: int = 0) -> np.ndarray:
    """The cluster of each row of ``hard_gallery(n, seed, stream=stream)`` (its chunks' first draw)."""
    out = np.empty(n, np.int64)
    for s in range(0, n, CHUNK):
        rows = min(CHUNK, n - s)
        out[s : s + rows] = np.random.default_rng([seed, s] + ([stream] if stream else [])).integers(0, CLUSTERS, rows)
    return out


def kth_scores(q: np.ndarray, x: np.ndarray, k: int, block: int = 65536) -> np.ndarray:
    """Each query's ``k``-th best score over ``x``: one pass over the gallery, every query in each block's matrix
    product (a per-query pass would read a 10M gallery once per query)."""
    k = min(k, len(x))
    best = np.full((len(q), k), -np.inf, np.float32)
    for s in range(0, len(x), block):
        both = np.concatenate([best, q @ np.asarray(x[s : s + block]).T], axis=1)
        best = np.partition(both, both.shape[1] - k, axis=1)[:, -k:]
    return best.min(axis=1)


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


def exact_topk(q: np.ndarray, x: np.ndarray, k: int, block: int = 65536) -> np.ndarray:
    """Each query's exact top-``k`` rows of ``x`` (unordered), in one blocked pass over the gallery."""
    k = min(k, len(x))
    best_s = np.full((len(q), k), -np.inf, np.float32)
    best_r = np.zeros((len(q), k), np.int64)
    for s in range(0, len(x), block):
        sc = q @ np.asarray(x[s : s + block]).T
        both_s = np.concatenate([best_s, sc], axis=1)
        both_r = np.concatenate([best_r, np.broadcast_to(np.arange(s, s + sc.shape[1]), sc.shape)], axis=1)
        top = np.argpartition(both_s, both_s.shape[1] - k, axis=1)[:, -k:]
        best_s, best_r = np.take_along_axis(both_s, top, 1), np.take_along_axis(both_r, top, 1)
    return best_r


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |found_q & truth_q| / k (k = truth's width)."""
    k = truth.shape[1]
    return float(np.mean([len(np.intersect1d(f[:k], t)) / k for f, t in zip(found, truth, strict=True)]))


def build(n: int, work: str) -> dict:
    """Generates the gallery into ``work/gallery.npy`` (memory-mapped), picks the stand-in calibrated tau on the
    validation queries, builds ``work/index`` with those queries and removes the gallery file (the index holds the
    embeddings). Returns the state saved as ``work/state.json``."""
    shutil.rmtree(work, ignore_errors=True)
    folder = os.path.join(work, "index")
    os.makedirs(folder)
    gallery = os.path.join(work, "gallery.npy")
    t = time.perf_counter()
    x = np.lib.format.open_memmap(gallery, "w+", np.float32, (n, DIM))
    hard_gallery(n, out=x)
    x.flush()
    gen_s = time.perf_counter() - t
    validation = hard_gallery(VALIDATION_QUERIES, stream=VALIDATION_STREAM)
    # tau: the median validation query's 100th score, so the median query has about 100 hits
    tau = float(np.median(kth_scores(validation[:200], x, 100)))
    t = time.perf_counter()
    stand_in = {"0.9": tau}  # a stand-in calibrated level
    # the memory map goes in as it is: write_index_folder's only in-memory copy is its leaf-ordered one
    manifest = write_index_folder(x, np.arange(n), folder, MODEL, version=1, thresholds=stand_in, queries=validation)
    build_s = time.perf_counter() - t
    del x
    os.remove(gallery)
    ts = manifest["threshold_search"]
    state = {
        "n": n,
        "seed": SEED,
        "validation_queries": VALIDATION_QUERIES,
        "tau": tau,
        "generate_seconds": round(gen_s, 2),
        "build_seconds": round(build_s, 2),
        "manifest_threshold_search": {k: ts[k] for k in ("method", "default")}
        | {k: ts.get("approximate", {}).get(k) for k in ("params", "set_recall", "meets_target", "num_queries")},
        "manifest_ann": {k: manifest["ann"][k] for k in ("recall_at_10", "num_queries", "query_source")},
        "leaves": {k: manifest["params"][k] for k in ("num_leaves", "leaves_to_search", "reorder_num_neighbors")},
    }
    with open(os.path.join(work, "state.json"), "w", encoding="utf-8") as f:
        json.dump(state, f)
    return state


def built_state(work: str, n: int) -> dict | None:
    """The state of an index this benchmark built and kept (``--keep``) for the same gallery, or None."""
    try:
        with open(os.path.join(work, "state.json"), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    same = (state.get("n"), state.get("seed"), state.get("validation_queries")) == (n, SEED, VALIDATION_QUERIES)
    return state if same and os.path.exists(os.path.join(work, "index", "manifest.json")) else None


def query_sets(num_queries: int, tau: float, xs: np.ndarray) -> dict:
    """``{name: (queries, tau, how tau was chosen)}`` (module docstring)."""
    same = hard_gallery(num_queries, stream=QUERY_STREAM)
    other = hard_gallery(num_queries, seed=SEED + 1)
    return {
        "gallery_clusters": (same, tau, "the stand-in calibrated threshold (validation queries' median 100 hits)"),
        "other_clusters": (other, float(np.median(kth_scores(other, xs, 100))), "these queries' median 100 hits"),
    }


def time_query_set(index, xs, queries: np.ndarray, tau: float, repeats: int, save_step) -> dict:
    """The five timed queries on one query set, their recalls and ratios."""
    b = len(queries)
    p = index.threshold_params
    num_leaves = int(index.manifest["params"]["num_leaves"])
    leaves = num_leaves if p is None else scann_leaves(int(index.leaves_to_search), num_leaves, len(xs), 100, p)
    reorder = math.ceil((1.0 if p is None else p.reorder_factor) * 100)
    out: dict = {"tau": tau, "queries_per_second": {}, "top100_setting": {"leaves": leaves, "reorder": reorder}}
    results = {}
    for name, fn in (
        ("top10", lambda: index.topk_rows(queries, 10)),
        ("top100_threshold_setting", lambda: index.topk_rows(queries, 100, leaves_to_search=leaves, reorder=reorder)),
        ("threshold_approximate", lambda: index.threshold_rows(queries, tau)),
        ("threshold_exact", lambda: index.threshold_rows(queries, tau, exact=True)),
        ("numpy_scan", lambda: numpy_scan(queries, xs, tau)),
    ):
        seconds, results[name] = timed(fn, repeats)
        out["queries_per_second"][name] = round(b / seconds, 1)
        save_step(out)
    truth = results["numpy_scan"]  # rows in leaf order, like the index's
    top = exact_topk(queries, xs, 100)
    top = np.take_along_axis(top, np.argsort(-_scores(queries, xs, top), axis=1), axis=1)  # best first
    hits = np.array([len(t) for t in truth])
    qps = out["queries_per_second"]
    exact_rows = results["threshold_exact"][0]
    return out | {
        "hits": {"median": float(np.median(hits)), "mean": float(hits.mean()), "max": int(hits.max())},
        "recall_at_10": recall_at(results["top10"][0], top[:, :10]),
        "recall_at_100_threshold_setting": recall_at(results["top100_threshold_setting"][0], top),
        "set_recall_held_out": set_recall([np.sort(r) for r in results["threshold_approximate"][0]], truth),
        "exact_equals_scan": all(np.array_equal(np.sort(e), t) for e, t in zip(exact_rows, truth, strict=True)),
        "ratios": {
            "threshold_vs_top10": round(qps["threshold_approximate"] / qps["top10"], 3),
            "threshold_vs_top100_threshold_setting": round(
                qps["threshold_approximate"] / qps["top100_threshold_setting"], 2
            ),
            "threshold_vs_scan": round(qps["threshold_approximate"] / qps["numpy_scan"], 2),
            "exact_vs_scan": round(qps["threshold_exact"] / qps["numpy_scan"], 2),
        },
    }


def _scores(queries: np.ndarray, xs: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``scores[b, j] = queries[b] . xs[rows[b, j]]``."""
    return np.einsum("bd,bjd->bj", queries, xs[rows])


def run(n: int, num_queries: int, repeats: int, workdir: str, keep: bool = False, save=None) -> dict:
    """Builds (or, with a kept index of an earlier ``--keep`` run, reuses) the index and times both query sets.
    ``save(record)`` is called after the build and after each timed query with the record so far
    (``"complete": false``), so an interrupted run leaves what it measured."""
    save = save or (lambda record: None)
    load = [_loadavg()]
    work = os.path.join(workdir, f"threshold_search_{n}")
    state = built_state(work, n) if keep else None
    reused = state is not None
    if state is None:
        state = build(n, work)
    index = GalleryIndex.load(os.path.join(work, "index"), expected_model=MODEL, mmap=True)
    xs = np.asarray(np.load(os.path.join(work, "index", "embeddings.npy"), mmap_mode="r"))
    load.append(_loadavg())
    record = {
        "benchmark": "threshold_search",
        "complete": False,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "load_average_1_5_15": {"start": load[0], "after_build": load[1]},
        "n": n,
        "dim": DIM,
        "num_queries": num_queries,
        "index_reused": reused,
        **{
            k: state[k]
            for k in ("tau", "generate_seconds", "build_seconds", "manifest_threshold_search", "manifest_ann", "leaves")
        },
        "query_sets": {},
    }
    save(record)
    for name, (queries, tau, how) in query_sets(num_queries, state["tau"], xs).items():

        def step(partial: dict, name=name, how=how) -> None:
            record["query_sets"][name] = partial | {"tau_from": how}
            save(record)

        step(time_query_set(index, xs, queries, tau, repeats, step))
    load.append(_loadavg())
    if not keep:
        shutil.rmtree(work)  # the memory maps stay valid after the files are unlinked (POSIX)
    record["load_average_1_5_15"]["end"] = load[2]
    return record | {"complete": True}


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _machine() -> dict:
    """CPU model and cores (``ce_retrieval.cli.demo_record.machine``: also instruction sets and versions)."""
    from ce_retrieval.cli.demo_record import machine

    return machine()


def markdown(r: dict, command: str) -> str:
    m = r["manifest_threshold_search"]
    lines = [
        f"# Threshold search, {r['n']:,} x {r['dim']} hard clustered gallery ({r['date']})",
        "",
        f"`{command}`; {r['machine'].get('cpu')}, {r['machine']['cpu_count']} cores; load average (1, 5, 15 min) "
        f"at start {r['load_average_1_5_15']['start']}, after build {r['load_average_1_5_15']['after_build']}, "
        f"at end {r['load_average_1_5_15']['end']}.",
        "",
        f"Gallery generated in {r['generate_seconds']} s, index built in {r['build_seconds']} s"
        f"{' (by an earlier --keep run, reused)' if r['index_reused'] else ''}: {r['leaves']['num_leaves']} leaves, "
        f"top-10 searches {r['leaves']['leaves_to_search']} and re-scores {r['leaves']['reorder_num_neighbors']} "
        f"(build recall@10 {r['manifest_ann']['recall_at_10']:.4f} on {r['manifest_ann']['num_queries']} "
        f"{r['manifest_ann']['query_source']}). Threshold search: default {m['default']}, tuned "
        f"{m['params']} with set recall {m['set_recall']} on {m['num_queries']} validation queries "
        f"(stand-in calibrated tau = {r['tau']:.4f}).",
        "",
        f"{r['num_queries']} timed queries per set, in one batch, median of the repeats:",
        "",
        "| queries | tau | hits median / mean / max | top-10 q/s (recall@10) | top-100 at the threshold setting q/s "
        "(recall@100) | approximate threshold q/s (set recall) | exact threshold q/s | NumPy scan q/s |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, qs in r["query_sets"].items():
        q, h = qs["queries_per_second"], qs["hits"]
        lines.append(
            f"| {name} | {qs['tau']:.4f} | {h['median']:.0f} / {h['mean']:.1f} / {h['max']} | "
            f"{q['top10']:,.1f} ({qs['recall_at_10']:.4f}) | {q['top100_threshold_setting']:,.1f} "
            f"({qs['recall_at_100_threshold_setting']:.4f}) | {q['threshold_approximate']:,.1f} "
            f"({qs['set_recall_held_out']:.4f}) | {q['threshold_exact']:,.1f} | {q['numpy_scan']:,.1f} |"
        )
    lines += [
        "",
        "Ratios (exact mode equals the scan in every set: "
        f"{all(qs['exact_equals_scan'] for qs in r['query_sets'].values())}):",
        "",
    ]
    for name, qs in r["query_sets"].items():
        lines.append(f"* {name}: " + ", ".join(f"{k} {v}" for k, v in qs["ratios"].items()))
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default=tempfile.gettempdir(), help="holds the gallery file and the index")
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep WORKDIR/threshold_search_<n>/ (the built index); a re-run with --keep reuses it, skipping the build",
    )
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args(argv)
    command = "python benchmarks/threshold_search.py " + " ".join(sys.argv[1:] if argv is None else argv)
    name = f"threshold_search_{args.n}"

    def save(record: dict) -> None:  # after the build and each timed query: an interrupted run keeps its figures
        write_json(args.out, name, record | {"command": command})

    r = run(args.n, args.queries, args.repeats, args.workdir, keep=args.keep, save=save)
    write_record(args.out, name, r | {"command": command}, markdown(r, command))


if __name__ == "__main__":
    main()
