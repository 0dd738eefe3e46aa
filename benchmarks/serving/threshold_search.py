"""Threshold search benchmark (issues #23, #32): approximate vs exact threshold queries vs top-k vs a NumPy scan.

The hard gallery: N unit vectors (d = 128, default 1,000,000; ``--n 10000000``) from 2,000 overlapping,
anisotropic clusters: x = normalise(c_k + U_k (s * z) + noise), c_k a random centre, U_k a random [d, 16] basis
with scales s decaying from 1.5 to 0.1 (elongated clusters), isotropic noise of the centres' scale (neighbours
are mostly, not only, in the query's cluster). Fixed seed; generated in chunks.

Two builds of the same gallery (``--builds``, default both), by ``write_index_folder`` (what ``build_index``
writes into an export's version folder; here without an export, under a stand-in model block):

* ``validation``: as ``ce-retrieval index`` builds one, with 1,000 validation queries (new draws of the gallery's
  own clusters, another sample stream of the generator) and a stand-in calibrated threshold for precision 0.9
  (tau at which the median validation query has 100 hits);
* ``defaults``: ``build_index(x, ids, export_dir, version)`` with its defaults: no validation queries, no
  thresholds (the threshold search is then tuned on gallery items, ``build.tuning.gallery_tuning_queries``);
* ``no_partitions`` (only when asked for): the defaults with ``threshold_partitions=False``, the faster build
  without the threshold partitions (no leaf expansion, probe or familiarity check), for the trade-off.

Three sets of 200 timed queries on each index:

* ``gallery_clusters``: fresh draws from the gallery's own clusters (another stream) at the stand-in tau;
* ``gallery_clusters_noisy``: draws of the same clusters with ``QUERY_NOISE`` x the items' own noise added, at
  their own median-100-hits tau (queries somewhat further from the gallery than its items);
* ``other_clusters``: draws from 2,000 *other* clusters (the generator with another seed), unlike the gallery and
  the validation queries, at their own median-100-hits tau (a stress case, e.g. a modality gap).

Timed per build and query set, one process, queries in one batch, median of ``--repeats`` runs:

* top-10 on the index (ScaNN), with its recall@10;
* top-100 at the approximate threshold search's tuned leaves and re-scoring (what one round of a threshold
  query costs at k = 100, the median hits), with its recall@100;
* ``threshold(q, tau)`` (the default: approximate, as the manifest says), its set recall vs the exact answer and
  how its answers were made (``GalleryIndex.answer_threshold``: the share answered exactly, by reason, and the set
  recall of the answers given approximately beside the figure they carry);
* ``threshold(q, tau, exact=True)``;
* a plain NumPy scan, ``q @ X.T >= tau`` in blocks of 65,536 rows.

    python -m benchmarks.serving.threshold_search                        # 1M
    python -m benchmarks.serving.threshold_search --n 10000000 --keep    # 10M (about 5 GB of embeddings a build)

Writes ``benchmarks/results/threshold_search_issue32_<n>.json`` and ``.md`` (``--record``; the #23 records
``threshold_search_<n>`` stay as they were) with the machine (CPU model, cores), load averages and date. The JSON
is written after each build and each timed query (``"complete": false`` until the end), so an interrupted run keeps
what it measured; with ``--keep`` the built indexes stay in ``WORKDIR/threshold_search_<n>/`` (``index``: the
validation build, which ``threshold_leaves.py`` also reads; ``index_defaults``) and a re-run with ``--keep`` reuses
them instead of generating and building again.

Memory: the gallery is generated into a memory-mapped ``.npy`` in WORKDIR and handed to ``write_index_folder`` as
it is, so its pages are file-backed (the kernel can drop them) instead of an anonymous copy held beside the build's
own leaf-ordered copy; the build's peak (that copy, ScaNN while it is built and once more when the folder is
loaded back) is what remains. Measured at 400k (peak RssAnon, sampled): 1.25 GB before this change, 1.05 GB after
(one gallery copy less); at 10M x 128 that copy is 5.1 GB. Disk: the gallery (5.1 GB at 10M, removed after the
builds) and each index (~11 GB).
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

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from benchmarks import RESULTS  # noqa: E402
from benchmarks.common.galleries import cluster_labels, clustered  # noqa: E402
from benchmarks.common.machine import host, load_average  # noqa: E402
from benchmarks.common.records import write_json, write_record  # noqa: E402
from ce_retrieval.build.index import BuildConfig, write_index_folder  # noqa: E402
from ce_retrieval.search.gallery import GalleryIndex  # noqa: E402  (imports ScaNN before BLAS work)
from ce_retrieval.search.threshold import scann_leaves, set_recall  # noqa: E402

DIM, CLUSTERS, RANK, CHUNK, SEED = 128, 2000, 16, 32_768, 23  # a chunk gathers [CHUNK, d, RANK] bases: 270 MB
QUERY_STREAM, VALIDATION_STREAM, VALIDATION_QUERIES = 1, 2, 1000
QUERY_NOISE = 1.0  # gallery_clusters_noisy: added noise, in units of the items' own noise
BUILDS = {"validation": "index", "defaults": "index_defaults", "no_partitions": "index_no_partitions"}  # -> folder
DEFAULT_BUILDS = ("validation", "defaults")
MODEL = {"fingerprint": "benchmark", "export_id": "benchmark", "embedding_dim": DIM, "normalization": "l2"}


def hard_gallery(
    n: int, seed: int = SEED, start: int = 0, out: np.ndarray | None = None, stream: int = 0, noise: float = 0.0
) -> np.ndarray:
    """Rows ``start:start+n`` of the hard clustered gallery (``galleries.clustered`` with elongated clusters), written
    into ``out`` when given (e.g. a memory-mapped ``.npy``: the gallery then never sits in anonymous memory).
    ``seed`` fixes the clusters and the sample stream; ``stream`` > 0 draws other samples of the same clusters
    (held-out queries: ``QUERY_STREAM``, ``VALIDATION_STREAM``); ``noise`` adds isotropic noise of that many times
    the items' own noise scale (queries further from their cluster than its items are)."""
    return clustered(n, DIM, CLUSTERS, seed, rank=RANK, chunk=CHUNK, start=start, stream=stream, noise=noise, out=out)


def hard_gallery_labels(n: int, seed: int = SEED, stream: int = 0) -> np.ndarray:
    """The cluster of each row of ``hard_gallery(n, seed, stream=stream)`` (its chunks' first draw)."""
    return cluster_labels(n, CLUSTERS, seed, chunk=CHUNK, stream=stream)


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


def build(n: int, work: str, builds=DEFAULT_BUILDS) -> dict:
    """Builds the ``builds`` (``BUILDS``) not already in ``work`` for the n-item gallery: generates it into
    ``work/gallery.npy`` (memory-mapped), picks the stand-in calibrated tau on the validation queries, builds each
    index folder and removes the gallery file (each index holds the embeddings). Returns the state saved as
    ``work/state.json``."""
    state = built_state(work, n)
    if state is None:
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        state = {"n": n, "seed": SEED, "validation_queries": VALIDATION_QUERIES, "builds": {}}
    missing = [b for b in builds if b not in state["builds"]]
    if not missing:
        return state
    gallery = os.path.join(work, "gallery.npy")
    t = time.perf_counter()
    x = np.lib.format.open_memmap(gallery, "w+", np.float32, (n, DIM))
    hard_gallery(n, out=x)
    x.flush()
    state["generate_seconds"] = round(time.perf_counter() - t, 2)
    validation = hard_gallery(VALIDATION_QUERIES, stream=VALIDATION_STREAM)
    # tau: the median validation query's 100th score, so the median query has about 100 hits
    state["tau"] = float(np.median(kth_scores(validation[:200], x, 100)))
    for name in missing:
        state["builds"][name] = build_one(x, os.path.join(work, BUILDS[name]), name, validation, state["tau"])
        _save_state(work, state)
    del x
    os.remove(gallery)
    return state


def build_one(x: np.ndarray, folder: str, name: str, validation: np.ndarray, tau: float) -> dict:
    """Builds one index folder (``validation``: with the validation queries and the stand-in threshold;
    ``defaults``: with neither; ``no_partitions``: neither, nor threshold partitions) and returns what the record
    states of it."""
    os.makedirs(folder)
    given = name == "validation"
    t = time.perf_counter()
    # the memory map goes in as it is: write_index_folder's only in-memory copy is its leaf-ordered one
    manifest = write_index_folder(
        x,
        np.arange(len(x)),
        folder,
        MODEL,
        version=1,
        thresholds={"0.9": tau} if given else None,  # a stand-in calibrated level
        queries=validation if given else None,
        config=BuildConfig(threshold_partitions=name != "no_partitions"),
    )
    ts = manifest["threshold_search"]
    approx = ts.get("approximate", {})
    keys = (
        "params",
        "set_recall",
        "set_recall_lower",
        "confidence",
        "meets_target",
        "num_queries",
        "query_source",
        "measured_on",
        "familiar",
        "served",
    )
    return {
        "build_seconds": round(time.perf_counter() - t, 2),
        "build_phases_seconds": manifest.get("build_phases_seconds"),
        "manifest_threshold_search": {k: ts[k] for k in ("method", "default")} | {k: approx.get(k) for k in keys},
        "manifest_ann": {k: manifest["ann"][k] for k in ("recall_at_10", "num_queries", "query_source")},
        "leaves": {k: manifest["params"][k] for k in ("num_leaves", "leaves_to_search", "reorder_num_neighbors")},
    }


def _save_state(work: str, state: dict) -> None:
    with open(os.path.join(work, "state.json"), "w", encoding="utf-8") as f:
        json.dump(state, f)


def built_state(work: str, n: int) -> dict | None:
    """The state of the indexes this benchmark built and kept (``--keep``) for the same gallery (only builds whose
    folder holds a manifest), or None."""
    try:
        with open(os.path.join(work, "state.json"), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    same = (state.get("n"), state.get("seed"), state.get("validation_queries")) == (n, SEED, VALIDATION_QUERIES)
    if not same or not isinstance(state.get("builds"), dict):
        return None
    state["builds"] = {
        b: v for b, v in state["builds"].items() if os.path.exists(os.path.join(work, BUILDS[b], "manifest.json"))
    }
    return state


def query_sets(num_queries: int, tau: float, xs: np.ndarray) -> dict:
    """``{name: (queries, tau, how tau was chosen)}`` (module docstring)."""
    same = hard_gallery(num_queries, stream=QUERY_STREAM)
    noisy = hard_gallery(num_queries, stream=QUERY_STREAM, noise=QUERY_NOISE)
    other = hard_gallery(num_queries, seed=SEED + 1)
    own = "these queries' median 100 hits"
    return {
        "gallery_clusters": (same, tau, "the stand-in calibrated threshold (validation queries' median 100 hits)"),
        "gallery_clusters_noisy": (noisy, float(np.median(kth_scores(noisy, xs, 100))), own),
        "other_clusters": (other, float(np.median(kth_scores(other, xs, 100))), own),
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
        ("threshold_approximate", lambda: index.answer_threshold_rows(queries, tau)),
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
    found = [np.sort(r) for r in results["threshold_approximate"][0]]
    return out | {
        "hits": {"median": float(np.median(hits)), "mean": float(hits.mean()), "max": int(hits.max())},
        "recall_at_10": recall_at(results["top10"][0], top[:, :10]),
        "recall_at_100_threshold_setting": recall_at(results["top100_threshold_setting"][0], top),
        "set_recall_held_out": set_recall(found, truth),
        "answers": answer_stats(results["threshold_approximate"][2], found, truth),
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


def answer_stats(answers: list, found: list[np.ndarray], truth: list[np.ndarray]) -> dict:
    """How the default search answered: the share answered exactly, the count per reason, and the set recall of
    the answers given approximately beside the figure they carry."""
    approx = [i for i, a in enumerate(answers) if not a.exact]
    reasons: dict[str, int] = {}
    for a in answers:
        reasons[a.reason] = reasons.get(a.reason, 0) + 1
    return {
        "exact_share": 1.0 - len(approx) / len(answers),
        "reasons": reasons,
        "approximate_set_recall": set_recall([found[i] for i in approx], [truth[i] for i in approx]),
        "approximate_promised": answers[approx[0]].set_recall if approx else None,
    }


def _scores(queries: np.ndarray, xs: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``scores[b, j] = queries[b] . xs[rows[b, j]]``."""
    return np.einsum("bd,bjd->bj", queries, xs[rows])


def run(
    n: int, num_queries: int, repeats: int, workdir: str, keep: bool = False, save=None, builds=DEFAULT_BUILDS
) -> dict:
    """Builds (or, with kept indexes of an earlier ``--keep`` run, reuses) the ``builds`` and times the three query
    sets on each. ``save(record)`` is called after each build's timing step with the record so far
    (``"complete": false``), so an interrupted run leaves what it measured."""
    save = save or (lambda record: None)
    load = {"start": load_average()}
    work = os.path.join(workdir, f"threshold_search_{n}")
    before = built_state(work, n) if keep else None
    reused = set((before or {}).get("builds", {}))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    state = build(n, work, builds)
    load["after_builds"] = load_average()
    record = {
        "benchmark": "threshold_search",
        "complete": False,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": host(),
        "load_average_1_5_15": load,
        "n": n,
        "dim": DIM,
        "num_queries": num_queries,
        "tau": state["tau"],
        "generate_seconds": state.get("generate_seconds"),
        "builds": {},
    }
    save(record)
    for name in builds:
        folder = os.path.join(work, BUILDS[name])
        index = GalleryIndex.load(folder, expected_model=MODEL, mmap=True)
        xs = np.asarray(np.load(os.path.join(folder, "embeddings.npy"), mmap_mode="r"))
        entry = record["builds"][name] = state["builds"][name] | {"index_reused": name in reused, "query_sets": {}}
        for qname, (queries, tau, how) in query_sets(num_queries, state["tau"], xs).items():

            def step(partial: dict, qname=qname, how=how, entry=entry) -> None:
                entry["query_sets"][qname] = partial | {"tau_from": how}
                save(record)

            step(time_query_set(index, xs, queries, tau, repeats, step))
        load[f"after_{name}"] = load_average()
        del index, xs
    if not keep:
        shutil.rmtree(work)  # the memory maps stay valid after the files are unlinked (POSIX)
    load["end"] = load_average()
    return record | {"complete": True}


def markdown(r: dict, command: str) -> str:
    load = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in r["load_average_1_5_15"].items())
    lines = [
        f"# Threshold search, {r['n']:,} x {r['dim']} hard clustered gallery ({r['date']})",
        "",
        f"`{command}`; {r['machine'].get('cpu')}, {r['machine']['cpu_count']} cores; load average (1, 5, 15 min): "
        f"{load}. Gallery generated in {r['generate_seconds']} s; stand-in calibrated tau = {r['tau']:.4f}.",
        "",
    ]
    for name, b in r["builds"].items():
        lines += _build_lines(name, b, r["num_queries"])
    return "\n".join(lines)


def _build_lines(name: str, b: dict, num_queries: int) -> list[str]:
    m, ann, lv = b["manifest_threshold_search"], b["manifest_ann"], b["leaves"]
    served = m.get("served") or {}
    lines = [
        f"## Build `{name}`",
        "",
        f"Built in {b['build_seconds']} s{' (by an earlier --keep run, reused)' if b['index_reused'] else ''} "
        f"(steps: {b.get('build_phases_seconds')}): {lv['num_leaves']} leaves, top-10 searches "
        f"{lv['leaves_to_search']} and re-scores {lv['reorder_num_neighbors']} (build recall@10 "
        f"{ann['recall_at_10']:.4f} on {ann['num_queries']} {ann['query_source']}). Threshold search: default "
        f"{m['default']}, tuned {m['params']} with set recall {m['set_recall']} (lower {m.get('confidence')} "
        f"bound {m.get('set_recall_lower')}) on {m['num_queries']} "
        f"{m.get('query_source')}; familiarity limits {_limits(m.get('familiar'))}; as served on those "
        f"queries: set recall {served.get('set_recall')}, answered exactly {served.get('exact_share')}, approximate "
        f"answers' set recall {served.get('set_recall_approximate')}.",
        "",
        f"{num_queries} timed queries per set, in one batch, median of the repeats:",
        "",
        "| queries | tau | hits median / mean / max | top-10 q/s (recall@10) | top-100 at the threshold setting q/s "
        "(recall@100) | approximate threshold q/s (set recall) | answered exactly | approximate answers' set recall "
        "(promised) | exact threshold q/s | NumPy scan q/s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for qname, qs in b["query_sets"].items():
        q, h, a = qs["queries_per_second"], qs["hits"], qs["answers"]
        lines.append(
            f"| {qname} | {qs['tau']:.4f} | {h['median']:.0f} / {h['mean']:.1f} / {h['max']} | "
            f"{q['top10']:,.1f} ({qs['recall_at_10']:.4f}) | {q['top100_threshold_setting']:,.1f} "
            f"({qs['recall_at_100_threshold_setting']:.4f}) | {q['threshold_approximate']:,.1f} "
            f"({qs['set_recall_held_out']:.4f}) | {a['exact_share']:.3f} | {_fmt(a['approximate_set_recall'])} "
            f"({_fmt(a['approximate_promised'])}) | {q['threshold_exact']:,.1f} | {q['numpy_scan']:,.1f} |"
        )
    lines += [
        "",
        "Ratios (exact mode equals the scan in every set: "
        f"{all(qs['exact_equals_scan'] for qs in b['query_sets'].values())}); why answers were exact:",
        "",
    ]
    for qname, qs in b["query_sets"].items():
        lines.append(f"* {qname}: " + ", ".join(f"{k} {v}" for k, v in qs["ratios"].items()))
        lines.append(f"  - reasons: {qs['answers']['reasons']}")
    lines.append("")
    return lines


def _limits(familiar: dict | None) -> dict:
    return {k: round(v["limit"], 4) for k, v in (familiar or {}).items() if isinstance(v, dict) and "limit" in v}


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", "--size", dest="n", type=int, default=1_000_000, help="gallery items")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--builds", default=",".join(DEFAULT_BUILDS), help=f"comma-separated, of {', '.join(BUILDS)}")
    ap.add_argument("--workdir", default=tempfile.gettempdir(), help="holds the gallery file and the indexes")
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep WORKDIR/threshold_search_<n>/ (the built indexes); a re-run with --keep reuses them",
    )
    ap.add_argument("--record", default=None, help="record name (default threshold_search_issue32_<n>)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    builds = tuple(b for b in args.builds.split(",") if b)
    unknown = set(builds) - set(BUILDS)
    if unknown:
        ap.error(f"unknown builds {sorted(unknown)}; choose from {', '.join(BUILDS)}")
    command = "python -m benchmarks.serving.threshold_search " + " ".join(sys.argv[1:] if argv is None else argv)
    name = args.record or f"threshold_search_issue32_{args.n}"

    def save(record: dict) -> None:  # after each timed step: an interrupted run keeps its figures
        write_json(args.out, name, record | {"command": command})

    r = run(args.n, args.queries, args.repeats, args.workdir, keep=args.keep, save=save, builds=builds)
    write_record(args.out, name, r | {"command": command}, markdown(r, command))


if __name__ == "__main__":
    main()
