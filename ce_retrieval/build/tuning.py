"""Tuning an index's search at build time against exact search: ScaNN's ``leaves_to_search`` and re-ranking depth
for recall@10 (:func:`tune_leaves`), and the approximate threshold search's parameters, familiarity limits and
served figures (:func:`tune_threshold_search`), on validation queries or, without them, on gallery items each
searched without itself (:func:`gallery_tuning_queries`). Used by ``build.index`` (each index folder),
``build.sharded`` and ``serve.recalibrate`` (thresholds refitted on new labels).

Set recall of a query set at threshold tau: sum_q |A_q ∩ E_q| / sum_q |E_q|, A_q the approximate answer and E_q
the exact one {x : q.x >= tau}; a setting is accepted when the one-sided lower confidence bound of that ratio
(queries as clusters) reaches the target. Gallery items as tuning queries overstate what new queries get, so on them
the miss rate 1 - set recall is counted ``GALLERY_ITEMS_MISS_FACTOR`` times: the bound must reach
1 - (1 - target) / factor, and the figure an approximate answer carries is 1 - factor * (1 - measured)."""

from __future__ import annotations

import math

import numpy as np

from ce_retrieval.search.ann import IndexParams
from ce_retrieval.search.exact import exact_search
from ce_retrieval.search.gallery import PARTITIONS_FILE, GalleryIndex
from ce_retrieval.search.partitions import BallPartitions, leaf_of_rows
from ce_retrieval.search.threshold import (
    APPROXIMATE,
    FAMILIAR_QUANTILE,
    NEAR_BAND,
    PROBE_LEAVES,
    SET_RECALL_CONFIDENCE,
    SPREAD_PRIOR,
    default_threshold_params,
    exact_sets,
    set_recall,
    tau_for_median_hits,
    tune_threshold_params,
)

TARGET_SET_RECALL = 0.99
THRESHOLD_TUNING_QUERIES = 200
GALLERY_ITEMS_MISS_FACTOR = 2.0
"""New queries' set-recall miss rate over the tuning gallery items' (each searched without itself), as an allowance:
the records measured 1.4-1.8x at 1M (two defaults builds and one without partitions, new draws of the gallery's
clusters, plain and noisy) and 0.6-1.1x at 10M; 1.0 for given (validation) queries."""


def recall_at_10(searcher_rows: np.ndarray, exact_rows: np.ndarray) -> float:
    """Share of the exact top-k (rows or ids [B, k]) found in the searcher's first k per query."""
    k = exact_rows.shape[1]
    hits = [len(np.intersect1d(a[:k], b)) for a, b in zip(searcher_rows, exact_rows, strict=True)]
    return float(np.sum(hits) / exact_rows.size)


def held_out_like(x: np.ndarray, rng: np.random.Generator, num: int = 1000) -> np.ndarray:
    """Queries like unseen points of the gallery's distribution: q = normalise(x_i + r_i u_i), r_i the distance
    from x_i to its nearest other gallery item and u_i a random unit vector. (Gallery points themselves would
    overstate recall: each sits in its own leaf and is its own nearest neighbour.)"""
    base = x[rng.choice(len(x), size=min(len(x), num), replace=False)]
    _, scores = exact_search(base, x, 2)
    radius = np.sqrt(np.maximum(2.0 - 2.0 * scores[:, 1:2], 0.0))
    u = rng.normal(size=base.shape).astype(np.float32)
    q = base + radius * u / np.linalg.norm(u, axis=1, keepdims=True)
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def tune_leaves(
    searcher, queries: np.ndarray, exact_rows: np.ndarray, p: IndexParams, target: float
) -> tuple[int, int, float, list[dict]]:
    """Cheapest (leaves_to_search, reorder) on a grid reaching ``target`` recall@10: leaves grow geometrically
    and, at each, the re-ranking depth is tried at 1x and 4x (hard, diffuse data needs deeper re-ranking
    rather than more leaves). Returns (leaves, reorder, recall, table)."""
    grid = sorted(
        {max(1, math.ceil(p.num_leaves * f)) for f in (0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)}
    )
    if p.leaves_to_search is not None:
        grid = [p.leaves_to_search]
    table = []
    for leaves in grid:
        for reorder in (p.reorder_num_neighbors, 4 * p.reorder_num_neighbors):
            rows, _ = searcher.search_batched_parallel(queries, 10, reorder, leaves)
            recall = recall_at_10(np.asarray(rows), exact_rows)
            table.append({"leaves_to_search": leaves, "reorder_num_neighbors": reorder, "recall_at_10": recall})
            if recall >= target:
                return leaves, reorder, recall, table
    best = max(table, key=lambda r: r["recall_at_10"])
    return best["leaves_to_search"], best["reorder_num_neighbors"], best["recall_at_10"], table


def gallery_tuning_queries(x: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``(queries, own rows, description)`` the approximate threshold search is tuned on when the build has no
    validation queries: ``THRESHOLD_TUNING_QUERIES`` gallery items, each searched for *without itself* (its own
    row is dropped from its answer and from its truth). Held-out items are draws of the gallery's distribution, as
    a query from its clusters is; the nearest-neighbour-moved points of ``held_out_like`` are not (on the 1M hard
    gallery, one index: set recall 0.961 for them, 0.993 for items, 0.992 for new draws of the gallery's
    clusters), and tuning on them took 2x the leaves such traffic needs. Queries unlike the gallery's items are
    what the per-query familiarity check is for (``search.threshold``)."""
    n = min(len(x), THRESHOLD_TUNING_QUERIES)
    rows = np.sort(np.random.default_rng(seed).choice(len(x), size=n, replace=False))
    return np.asarray(x[rows]), rows, "gallery items as queries, each without itself (no validation queries given)"


def _without_own_rows(sets: list[np.ndarray], own_rows: np.ndarray | None) -> list[np.ndarray]:
    return sets if own_rows is None else [r[r != o] for r, o in zip(sets, own_rows, strict=True)]


def tune_threshold_search(
    searcher,
    x: np.ndarray,
    partitions: BallPartitions,
    params: dict,
    queries: np.ndarray,
    source: str,
    thresholds: dict | None,
    target: float,
    own_rows: np.ndarray | None = None,
) -> dict:
    """The manifest's ``threshold_search`` block of a ScaNN index, from (at most ``THRESHOLD_TUNING_QUERIES``)
    tuning ``queries`` (``own_rows``: each query's own gallery row, left out of its answer and truth, for gallery
    items as queries: :func:`gallery_tuning_queries`):

    * the approximate search's parameters whose set recall (its lower 95 % bound over the queries) reaches
      ``target`` against exact search at each calibrated threshold and at the threshold where the median query
      has 100 hits (so a figure exists even when the calibrated thresholds admit no item of this gallery);
    * ``familiar``: the ``FAMILIAR_QUANTILE`` of the tuning queries' familiarity statistics at those parameters
      (``threshold.spread``, ``threshold.missed``), the limits of the per-query check;
    * ``served``: the search as it answers (cost model and familiarity check on) on the same queries: set recall,
      the share answered exactly, and the set recall of the answers given approximately (the figure each such
      answer carries)."""
    q = queries[:THRESHOLD_TUNING_QUERIES]
    own_rows = None if own_rows is None else own_rows[:THRESHOLD_TUNING_QUERIES]
    taus = dict(thresholds or {})
    taus["median_100_hits"] = tau_for_median_hits(q, x, 100 + (own_rows is not None))  # an item is its own hit
    names = list(taus)
    exact = exact_sets(q, x, [taus[t] for t in names])
    truth = {t: _without_own_rows(s, own_rows) for t, s in zip(names, exact, strict=True)}
    index = GalleryIndex("", {"params": params}, x, np.arange(len(x)), partitions, searcher)
    index.probe_leaves = PROBE_LEAVES if partitions is not None else 0
    familiar: dict[tuple[float, str], dict] = {}  # the familiarity statistics of each (tau, params) searched

    def search(queries_, tau, p):
        rows, _, _, familiar[(tau, repr(p))] = index.approximate_threshold_rows(queries_, tau, p, checks=False)
        return [np.sort(r) for r in _without_own_rows(rows, own_rows)]

    base = default_threshold_params(len(x), params["reorder_num_neighbors"])
    base.expand_leaves = partitions is not None
    every_leaf = params["num_leaves"] / max(1, params["leaves_to_search"])  # the leaves factor that searches all

    def expansion_items(found: list[np.ndarray]) -> float:  # the members of the leaves holding a query's hits
        sizes = np.diff(partitions.offsets)
        return float(np.mean([sizes[np.unique(leaf_of_rows(partitions, r))].sum() for r in found]))

    factor = 1.0 if own_rows is None else GALLERY_ITEMS_MISS_FACTOR
    tuning_target = 1.0 - (1.0 - target) / factor  # what the tuning queries must reach for new ones to reach target
    p, chosen, table = tune_threshold_params(
        search, q, taus, truth, base, tuning_target, max_leaves_factor=every_leaf, expansion_items=expansion_items
    )
    for tau in taus.values():  # the chosen point's statistics at every threshold (the walk measured them, or now)
        if (tau, repr(p)) not in familiar:
            search(q, tau, p)
    at_p = [familiar[(tau, repr(p))] for tau in taus.values()]  # NaN: queries the rounds did not answer
    pooled = {name: np.concatenate([f[name] for f in at_p]) for name in at_p[0]}
    limits = {  # none without partitions (the statistics are of partition leaves) or without an approximate answer
        name: float(np.quantile(v[np.isfinite(v)], FAMILIAR_QUANTILE))
        for name, v in pooled.items()
        if np.isfinite(v).any()
    }
    index.threshold_params, index.familiar_limits = p, limits
    recalls, lower = chosen["set_recall"], chosen["set_recall_lower"]
    measured = [r for r in recalls.values() if r is not None]
    bounds = [r for r in lower.values() if r is not None]
    meets = min(bounds, default=1.0) >= tuning_target
    return {
        "method": "approximate by default: ScaNN top-k with k grown x"
        f"{p.growth} from {p.start_k} until the k-th exact score < tau (exact past k = {p.max_k})"
        + ("; then every item of the partition leaves holding a hit, scored exactly" if p.expand_leaves else "")
        + "; a query is answered exactly instead when its next step would cost more than a scan (cost model) or "
        "its hits look unlike the tuning queries' (familiar: spread over leaves, hits missed in probe leaves, "
        "near-misses per hit); "
        "exact=true: ball-bounded k-means leaves + exact re-scoring, or a scan when pruning cannot win",
        "default": "approximate" if meets else "exact",
        "file": PARTITIONS_FILE if partitions is not None else None,
        "partition_leaves": 0 if partitions is None else len(partitions.offsets) - 1,
        "approximate": {
            "params": p.to_json(),
            "set_recall": recalls,
            "set_recall_min": min(measured) if measured else None,
            "set_recall_lower": lower,
            "set_recall_lower_min": min(bounds) if bounds else None,
            "confidence": SET_RECALL_CONFIDENCE,
            "thresholds": taus,
            "mean_hits": {t: float(np.mean([len(r) for r in truth[t]])) for t in names},
            "target": target,
            "miss_factor": factor,
            "tuning_target": tuning_target,
            "meets_target": meets,
            "num_queries": len(q),
            "query_source": source,
            "measured_on": "given_queries" if own_rows is None else "gallery_items",
            "familiar": None
            if not limits
            else {
                "quantile": FAMILIAR_QUANTILE,
                "probe_leaves": PROBE_LEAVES,
                "spread": {
                    "statistic": f"partition leaves holding the hits the rounds found / (found + {SPREAD_PRIOR:g})",
                    "limit": limits["spread"],
                },
                "missed": {
                    "statistic": f"hits in the {PROBE_LEAVES} probe leaves (highest mean score, no found hit) / "
                    f"(found + {SPREAD_PRIOR:g})",
                    "limit": limits["missed"],
                },
            }
            | (
                {}
                if "near" not in limits
                else {
                    "near": {
                        "statistic": f"items of the scored leaves in [tau - {NEAR_BAND:g}, tau) / (their hits + "
                        f"{SPREAD_PRIOR:g})",
                        "band": NEAR_BAND,
                        "limit": limits["near"],
                    }
                }
            ),
            "served": _served_figures(index, q, own_rows, taus, truth, factor),
            "tuning": table,
        },
    }


def _served_figures(
    index: GalleryIndex, q: np.ndarray, own_rows, taus: dict, truth: dict, miss_factor: float = 1.0
) -> dict:
    """The tuned search as it answers (checks on) on the tuning queries: set recall per threshold, the share of
    queries answered exactly, ``set_recall_approximate_measured``: the lowest over thresholds of the set recall of
    the answers it gave approximately, and ``set_recall_approximate``, the figure each approximate answer carries:
    1 - miss_factor * (1 - measured) (the measured figure for given queries)."""
    overall, approximate, exact_share = {}, {}, {}
    for name, tau in taus.items():
        rows, _, reasons, _ = index.approximate_threshold_rows(q, tau, index.threshold_params)
        found = [np.sort(r) for r in _without_own_rows(rows, own_rows)]
        approx = [i for i, r in enumerate(reasons) if r == APPROXIMATE]
        overall[name] = set_recall(found, truth[name])
        approximate[name] = set_recall([found[i] for i in approx], [truth[name][i] for i in approx])
        exact_share[name] = 1.0 - len(approx) / len(q)
    measured = min((r for r in approximate.values() if r is not None), default=None)
    return {
        "set_recall": overall,
        "exact_share": exact_share,
        "set_recall_approximate_by_threshold": approximate,
        "set_recall_approximate_measured": measured,
        "set_recall_approximate": None if measured is None else max(0.0, 1.0 - miss_factor * (1.0 - measured)),
    }
