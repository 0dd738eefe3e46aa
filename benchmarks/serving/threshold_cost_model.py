"""Unit costs of the threshold search's cost model (issue #32), in gallery items of the exact scan.

``threshold_search.CostModel`` prices each step of the approximate search per query as

    round(k) = QUANTISED_ITEM x items in the searched ScaNN leaves + RESCORED_ITEM x candidates re-scored,
    expansion = EXPANDED_ITEM x members of the expanded leaves,

against an exact search of ``n`` (a scan). This benchmark measures those constants on an index of
``benchmarks/serving/threshold_search.py``'s hard gallery (the one its ``--keep`` run left in WORKDIR, or one built here
the same way), with queries of the gallery's own clusters, for a batch of ``--batch`` queries (a benchmark's) and
for one query at a time (a service's request):

* the exact scan (``partitions.scan_hits``) per query and gallery item, at the batch and at one query;
* ScaNN top-k over a grid of (leaves searched, candidates re-scored), fitted by non-negative least squares as
  ``t = a x searched items + b x re-scored + c`` per query (``c``, a fixed part per call, is reported; at 1M it
  is small beside a round, and the model leaves it out);
* the leaf expansion of the hits a round found, per member scored (``e``);

and reports them in the code's unit (``units``) beside the constants in the code.

    python -m benchmarks.serving.threshold_cost_model --workdir /tmp/ts        # 1M; reuses threshold_search.py --keep's

Writes ``benchmarks/results/threshold_cost_model.json`` and ``.md`` with the machine and the load.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from scipy.optimize import nnls  # noqa: E402

from benchmarks import RESULTS  # noqa: E402
from benchmarks.common.machine import host, load_average  # noqa: E402
from benchmarks.common.records import write_record  # noqa: E402
from benchmarks.serving import threshold_search as ts  # noqa: E402
from ce_retrieval.search import threshold as model  # noqa: E402
from ce_retrieval.search.gallery import GalleryIndex  # noqa: E402  (imports ScaNN before BLAS work)
from ce_retrieval.search.partitions import scan_hits  # noqa: E402
from ce_retrieval.search.threshold import expand_to_leaves  # noqa: E402

LEAVES_FACTORS = (1, 2, 4, 8)  # x the top-10 setting's leaves
RESCORED = (200, 800, 3200, 12800)  # k of the growth's rounds from the re-ranking depth 200 (x 4 a round)


def per_query_seconds(fn, queries: np.ndarray, batch: int, repeats: int) -> float:
    """Median over ``repeats`` of the seconds per query of ``fn(queries[batch slice])`` over the whole set."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for s in range(0, len(queries), batch):
            fn(queries[s : s + batch])
        times.append((time.perf_counter() - t) / len(queries))
    return float(np.median(times))


def measure(index: GalleryIndex, queries: np.ndarray, tau: float, batch: int, repeats: int) -> dict:
    """Seconds per query of the scan, of ScaNN over the grid (and the least-squares fit ``a, b, c``) and of the
    expansion per member, for one batch size (module docstring)."""
    xs, n = np.asarray(index.embeddings), len(index)
    num_leaves, base = int(index.manifest["params"]["num_leaves"]), int(index.leaves_to_search)
    scan = per_query_seconds(lambda q: scan_hits(q, xs, tau), queries, batch, repeats)
    rows, grid = [], []
    for factor in LEAVES_FACTORS:
        leaves = min(num_leaves, factor * base)
        for pre in RESCORED:
            t = per_query_seconds(
                lambda q, leaves=leaves, pre=pre: index.topk_rows(q, pre, leaves_to_search=leaves, reorder=pre),
                queries,
                batch,
                repeats,
            )
            searched = max(leaves, np.ceil(2 * pre * num_leaves / n)) * n / num_leaves  # topk_rows' own floor
            rows.append([searched, pre, 1.0])
            grid.append({"leaves": leaves, "rescored": pre, "ms_per_query": round(1000 * t, 4)})
    times = np.array([g["ms_per_query"] / 1000 for g in grid])
    (a, b, c), _ = nnls(np.array(rows), times)  # non-negative: a fixed cost or a price per item is never < 0
    found = [r[: max(1, len(r) // 2)] for r in index.topk_rows(queries, 200)[0]]  # half the hits of a round
    members = np.mean([np.diff(index.partitions.offsets)[v].sum() for v in model.hit_leaves(index.partitions, found)])
    e = per_query_seconds(
        lambda q: expand_to_leaves(q, tau, found[: len(q)], xs, index.partitions), queries, batch, repeats
    )
    return {
        "batch": batch,
        "scan_ns_per_item": round(1e9 * scan / n, 4),
        "scann_grid": grid,
        "scann_fit_ns": {"per_searched_item": 1e9 * a, "per_rescored": 1e9 * b, "per_round": 1e9 * c},
        "expansion_members_per_query": float(members),
        "expansion_ns_per_member": 1e9 * e / members,
    }


def units(batched: dict, single: dict) -> dict:
    """The constants in the code's unit: one (query, item) product of a batched scan, alpha, with the scan per
    query ``n alpha (1 + SCAN_READ / B)`` (the gallery read once per batch of B): from the scan at B and at 1,
    ``SCAN_READ = (t_1 - t_B) / (t_B - t_1 / B)``. The other constants from the batched measurement."""
    t1, tb, b = single["scan_ns_per_item"], batched["scan_ns_per_item"], batched["batch"]
    read = (t1 - tb) / (tb - t1 / b)
    alpha = tb / (1 + read / b)
    fit = batched["scann_fit_ns"]
    return {
        "alpha_ns": round(alpha, 4),
        "SCAN_READ": round(read, 2),
        "QUANTISED_ITEM": round(fit["per_searched_item"] / alpha, 4),
        "RESCORED_ITEM": round(fit["per_rescored"] / alpha, 3),
        "fixed_per_call": round(fit["per_round"] / alpha, 1),
        "EXPANDED_ITEM": round(batched["expansion_ns_per_member"] / alpha, 3),
        "one_query": {  # the same fit for single queries (ScaNN then runs on one core), in alpha too
            "QUANTISED_ITEM": round(single["scann_fit_ns"]["per_searched_item"] / alpha, 4),
            "RESCORED_ITEM": round(single["scann_fit_ns"]["per_rescored"] / alpha, 3),
            "fixed_per_call": round(single["scann_fit_ns"]["per_round"] / alpha, 1),
            "EXPANDED_ITEM": round(single["expansion_ns_per_member"] / alpha, 3),
        },
    }


def markdown(r: dict, command: str) -> str:
    code, u = r["in_code"], r["units"]
    names = ("QUANTISED_ITEM", "RESCORED_ITEM", "EXPANDED_ITEM")
    lines = [
        f"# Threshold search cost model: unit costs, {r['n']:,} x {ts.DIM} hard gallery ({r['date']})",
        "",
        f"`{command}`; {r['machine'].get('cpu')}, {r['machine']['cpu_count']} cores; load average (1, 5, 15 min) at "
        f"start {r['load_average_1_5_15']['start']}, at end {r['load_average_1_5_15']['end']}. Queries of the "
        f"gallery's clusters at tau = {r['tau']:.4f}; the index's top-10 setting searches {r['leaves_to_search']} "
        f"of {r['num_leaves']} leaves.",
        "",
        f"Unit: alpha = {u['alpha_ns']} ns, one (query, item) product of the batched exact scan; the scan per query "
        f"is n alpha (1 + SCAN_READ / B): {r['batches'][0]['scan_ns_per_item']} ns per item at B = "
        f"{r['batches'][0]['batch']}, {r['batches'][1]['scan_ns_per_item']} ns at B = 1.",
        "",
        "| | SCAN_READ | " + " | ".join(names) + " | fixed part per ScaNN call (not in the model) |",
        "|---|---:|---:|---:|---:|---:|",
        f"| measured, B = {r['batches'][0]['batch']} | {u['SCAN_READ']} | "
        + " | ".join(str(u[k]) for k in names)
        + f" | {u['fixed_per_call']} |",
        "| measured, B = 1 (ScaNN on one core) | | "
        + " | ".join(str(u["one_query"][k]) for k in names)
        + f" | {u['one_query']['fixed_per_call']} |",
        f"| in the code | {code['SCAN_READ']} | " + " | ".join(str(code[k]) for k in names) + " | 0 |",
        "",
        "ScaNN top-k per query (ms) over the grid the constants were fitted on:",
        "",
        "| batch | leaves | re-scored | ms / query |",
        "|---:|---:|---:|---:|",
    ]
    for m in r["batches"]:
        lines += [f"| {m['batch']} | {g['leaves']} | {g['rescored']} | {g['ms_per_query']} |" for g in m["scann_grid"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--batch", type=int, default=200, help="the batched measurement's batch (a service's is 1)")
    ap.add_argument("--single_queries", type=int, default=50, help="queries timed one at a time")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default=tempfile.gettempdir(), help="where threshold_search.py --keep left its index")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    command = "python -m benchmarks.serving.threshold_cost_model " + " ".join(sys.argv[1:] if argv is None else argv)
    load = [load_average()]
    work = os.path.join(args.workdir, f"threshold_search_{args.n}")
    state = ts.built_state(work, args.n) or ts.build(args.n, work)
    index = GalleryIndex.load(os.path.join(work, "index"), expected_model=ts.MODEL, mmap=True)
    queries = ts.hard_gallery(args.queries, stream=ts.QUERY_STREAM)
    batches = [
        measure(index, queries, state["tau"], args.batch, args.repeats),
        measure(index, queries[: args.single_queries], state["tau"], 1, args.repeats),
    ]
    load.append(load_average())
    record = {
        "benchmark": "threshold_cost_model",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": host(),
        "load_average_1_5_15": {"start": load[0], "end": load[1]},
        "n": args.n,
        "num_queries": args.queries,
        "tau": state["tau"],
        "num_leaves": int(index.manifest["params"]["num_leaves"]),
        "leaves_to_search": int(index.leaves_to_search),
        "batches": batches,
        "units": units(*batches),
        "in_code": {k: getattr(model, k) for k in ("SCAN_READ", "QUANTISED_ITEM", "RESCORED_ITEM", "EXPANDED_ITEM")},
        "command": command,
    }
    write_record(args.out, "threshold_cost_model", record, markdown(record, command))


if __name__ == "__main__":
    main()
