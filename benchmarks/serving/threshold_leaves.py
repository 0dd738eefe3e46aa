"""Where a threshold query's hits lie, and what the leaf expansion recovers (issue #23).

On the hard clustered gallery of ``benchmarks/serving/threshold_search.py`` (its ``validation`` build) and its query
sets (new draws of the gallery's own clusters at the stand-in calibrated tau; the same with added noise, and draws of
other clusters, each at its own median-100-hits tau), from the exact answers:

* the share of the hits in the query's own cluster;
* for k-means partitions of the gallery (flat with ScaNN's leaf count; flat with the index's threshold partitions,
  ~128 items a leaf; each of ScaNN's leaf count split in 8 by its own k-means): the leaves an oracle needs to hold
  99 % of a query's hits (median over queries), and what the leaf expansion gives from the hits ScaNN finds with the
  top-10 setting's leaves and 2 k re-scored (no expansion): the set recall after scoring every member of the leaves
  holding a found hit, and the items that costs per query.

    python -m benchmarks.serving.threshold_leaves --workdir /tmp/tl      # 1M; builds like threshold_search.py (--keep)

Writes ``benchmarks/results/threshold_leaves.json`` and ``.md`` with the machine and the load.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from benchmarks import RESULTS  # noqa: E402
from benchmarks.common.machine import host, load_average  # noqa: E402
from benchmarks.common.records import write_record  # noqa: E402
from benchmarks.serving import threshold_search as ts  # noqa: E402
from ce_retrieval.search.gallery import GalleryIndex  # noqa: E402  (imports ScaNN before BLAS work)
from ce_retrieval.search.partitions import build_partitions, leaf_of_rows, spherical_kmeans  # noqa: E402
from ce_retrieval.search.threshold import set_recall  # noqa: E402


def nearest_centre(x: np.ndarray, centers: np.ndarray, chunk: int = 65536) -> np.ndarray:
    return np.concatenate([np.argmax(x[s : s + chunk] @ centers.T, axis=1) for s in range(0, len(x), chunk)])


def split_partitions(x: np.ndarray, num_leaves: int, split: int, seed: int = 0) -> np.ndarray:
    """Leaf of each row: ``num_leaves`` k-means leaves, each split in ``split`` by a k-means of its members."""
    coarse = nearest_centre(x, spherical_kmeans(x, num_leaves, seed=seed))
    fine = np.zeros(len(x), np.int64)
    for leaf in range(num_leaves):
        members = np.flatnonzero(coarse == leaf)
        if len(members) >= 2 * split:
            sub = x[members]
            fine[members] = nearest_centre(
                sub, spherical_kmeans(sub, split, sample_size=len(sub), seed=seed + 1 + leaf)
            )
    return coarse * split + fine


def flat_partitions(x: np.ndarray, num_leaves: int, seed: int = 0) -> np.ndarray:
    order, parts = build_partitions(x, num_leaves, seed=seed)
    leaf = np.empty(len(x), np.int64)
    leaf[order] = leaf_of_rows(parts, np.arange(len(x)))
    return leaf


def leaf_stats(leaf: np.ndarray, truth: list[np.ndarray], found: list[np.ndarray]) -> dict:
    sizes = np.bincount(leaf)
    oracle, items, kept, total = [], [], 0, 0
    for t, f in zip(truth, found, strict=True):
        if len(t):
            per_leaf = np.sort(np.bincount(leaf[t]))[::-1]
            oracle.append(int(np.searchsorted(np.cumsum(per_leaf), 0.99 * len(t) - 1e-9) + 1))
        probed = np.unique(leaf[f])
        items.append(int(sizes[probed].sum()))
        kept += int(np.isin(leaf[t], probed).sum())
        total += len(t)
    return {
        "leaves": int(len(sizes)),
        "oracle_leaves_99_median": float(np.median(oracle)),
        "expanded_set_recall": kept / total,
        "items_scored_per_query": float(np.mean(items)),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--workdir", default=tempfile.gettempdir(), help="a --keep index of threshold_search.py, reused")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    command = "python -m benchmarks.serving.threshold_leaves " + " ".join(sys.argv[1:] if argv is None else argv)
    load = [load_average()]
    work = os.path.join(args.workdir, f"threshold_search_{args.n}")
    state = ts.build(args.n, work, ("validation",))  # reuses a kept validation build
    index = GalleryIndex.load(os.path.join(work, "index"), expected_model=ts.MODEL, mmap=True)
    xs = np.asarray(np.load(os.path.join(work, "index", "embeddings.npy"), mmap_mode="r"))
    labels = ts.hard_gallery_labels(args.n)[index.ids]  # rows are in leaf order; ids are generator rows
    num_leaves = int(index.manifest["params"]["num_leaves"])
    variants = {
        f"flat, {num_leaves} leaves (ScaNN's count)": flat_partitions(xs, num_leaves),
        f"flat, {len(index.partitions.offsets) - 1} leaves (the index's threshold partitions)": (
            leaf_of_rows(index.partitions, np.arange(len(xs)))
        ),
        f"{num_leaves} leaves each split in 8": split_partitions(xs, num_leaves, 8),
    }
    no_expansion = dataclasses.replace(
        index.threshold_params, leaves_factor=1.0, reorder_factor=2.0, expand_leaves=False
    )
    record = {
        "benchmark": "threshold_leaves",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": host(),
        "n": args.n,
        "query_sets": {},
    }
    for name, (queries, tau, how) in ts.query_sets(args.queries, state["tau"], xs).items():
        truth = ts.numpy_scan(queries, xs, tau)
        index.probe_leaves = 0  # the ANN's own hits: no probe leaves, and no checks answering queries exactly
        found = [np.sort(r) for r in index.approximate_threshold_rows(queries, tau, no_expansion, checks=False)[0]]
        qs = {"tau": tau, "tau_from": how, "ann_set_recall_no_expansion": set_recall(found, truth)}
        if name == "gallery_clusters":
            qlab = ts.hard_gallery_labels(args.queries, stream=ts.QUERY_STREAM)
            own = sum(int(np.sum(labels[t] == c)) for t, c in zip(truth, qlab, strict=True))
            qs["own_cluster_share"] = own / sum(len(t) for t in truth)
        qs["partitions"] = {v: leaf_stats(leaf, truth, found) for v, leaf in variants.items()}
        record["query_sets"][name] = qs
    load.append(load_average())
    record["load_average_1_5_15"] = {"start": load[0], "end": load[1]}
    write_record(args.out, "threshold_leaves", record | {"command": command}, markdown(record, command))


def markdown(r: dict, command: str) -> str:
    lines = [
        f"# Where threshold hits lie, {r['n']:,} x 128 hard clustered gallery ({r['date']})",
        "",
        f"`{command}`; {r['machine'].get('cpu')}, {r['machine']['cpu_count']} cores; load average (1, 5, 15 min) "
        f"at start {r['load_average_1_5_15']['start']}, at end {r['load_average_1_5_15']['end']} (figures here are "
        "counts, not timings).",
        "",
    ]
    for name, qs in r["query_sets"].items():
        lines += [
            f"## {name} (tau = {qs['tau']:.4f}, {qs['tau_from']})",
            "",
            f"ScaNN with the top-10 setting's leaves and 2 k re-scored, no expansion: set recall "
            f"{qs['ann_set_recall_no_expansion']:.4f}."
            + (
                f" Hits in the query's own cluster: {qs['own_cluster_share']:.4f}." if "own_cluster_share" in qs else ""
            ),
            "",
            "| partitions | leaves | oracle leaves for 99 % of a query's hits (median) | expanded set recall | "
            "items scored per query |",
            "|---|---:|---:|---:|---:|",
        ]
        for v, st in qs["partitions"].items():
            lines.append(
                f"| {v} | {st['leaves']:,} | {st['oracle_leaves_99_median']:.0f} | {st['expanded_set_recall']:.4f} | "
                f"{st['items_scored_per_query']:,.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
