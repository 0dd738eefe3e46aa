"""A loaded gallery index: top-k and exact threshold search over unit-norm image embeddings.

Scores are cosine similarities s(q, x) = q.x of L2-normalised embeddings (the quantity the thresholds in the
manifest were calibrated on). Top-k uses the ScaNN searcher when the index has one (tree + anisotropic
asymmetric hashing + exact float32 re-ranking, so the returned scores are exact dot products), otherwise exact
chunked brute force. Threshold search is approximate by default on an index whose manifest records a measured set
recall for it (``threshold``: top-k grown until the k-th score falls below tau), exact otherwise or with
``exact=True`` (``partitions.exact_threshold_search``: ball-bounded leaves, or a blocked scan when pruning cannot win).
Within the approximate search a query is still answered exactly when growing top-k would cost more than a scan or
its hits look unlike the tuning queries' (``threshold``'s cost model and familiarity check);
:meth:`GalleryIndex.answer_threshold` says for each query which it got (:class:`ThresholdAnswer`).

Loading checks the index against the model it will be queried with: embedding dimension, normalisation and the
export fingerprint must match, and the stored arrays must match the manifest; otherwise ``IndexMismatchError``.
This module reads one index folder (``INDEX_FORMAT``); a sharded version folder (``SHARDED_FORMAT``, one such
folder per shard) is refused here and loaded by ``ce_retrieval.search.sharded.load_index``.
"""

from __future__ import annotations

import hashlib
import math
import os

import numpy as np

# Imported eagerly on purpose: importing ScaNN only after NumPy has run multi-threaded BLAS work made its
# quantiser training ~50x slower on our 2-core machine (15 s instead of 0.3 s for 5,000 points; measured).
from scann.scann_ops.py import scann_ops_pybind

from ce_retrieval.search import layout
from ce_retrieval.search import threshold as ts
from ce_retrieval.search.exact import ExactSearch
from ce_retrieval.search.interface import SearchIndex
from ce_retrieval.search.partitions import BallPartitions, exact_threshold_search
from ce_retrieval.search.threshold import (
    CostModel,
    ThresholdAnswer,
    ThresholdParams,
    grow_topk_threshold,
    hit_leaves,
    missed,
    near_misses,
    probe_leaves,
    scann_leaves,
    score_leaves_near,
    spread,
)

EMBEDDINGS_FILE, IDS_FILE, PARTITIONS_FILE, SCANN_DIR = "embeddings.npy", "ids.npy", "partitions.npz", "scann"
INDEX_FORMAT = "ce_retrieval.index/1"  # one index folder (this module)
SHARDED_FORMAT = "ce_retrieval.sharded_index/1"  # shard folders of INDEX_FORMAT (``sharded_index``)


class IndexMismatchError(ValueError):
    """The index was built for another model (or is corrupt) and must not be served with this one."""


def ids_digest(ids: np.ndarray) -> str:
    """SHA-256 of the ids as little-endian int64 bytes in stored (row) order."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<i8").tobytes()).hexdigest()


def embeddings_digest(embeddings: np.ndarray, chunk_rows: int = 65536) -> str:
    """SHA-256 of the embeddings as little-endian float32 bytes, row-major in stored (row) order (hashed in
    chunks, so a memory-mapped gallery is never copied whole)."""
    h = hashlib.sha256()
    for s in range(0, len(embeddings), chunk_rows):
        h.update(np.ascontiguousarray(embeddings[s : s + chunk_rows], dtype="<f4").tobytes())
    return h.hexdigest()


class GalleryIndex(SearchIndex):
    """Searches one ``<export_dir>/index/<version>/`` folder (brute force or ScaNN). Rows are in the index's internal
    (leaf) order."""

    def __init__(
        self,
        path: str,
        manifest: dict,
        embeddings: np.ndarray,
        ids: np.ndarray,
        partitions: BallPartitions | None,
        scann_searcher=None,
    ):
        self.path, self.manifest = path, manifest
        self.embeddings, self.ids = embeddings, ids
        self.partitions, self.scann = partitions, scann_searcher
        params = manifest.get("params") or {}
        self.leaves_to_search = params.get("leaves_to_search")
        self.reorder = params.get("reorder_num_neighbors")
        approx = (manifest.get("threshold_search") or {}).get("approximate")
        # approximate threshold search only where the build measured its set recall (and met the target)
        self.threshold_params = (
            ThresholdParams.from_json(approx["params"])
            if scann_searcher is not None and approx and approx.get("meets_target")
            else None
        )
        approx = approx or {}
        # the familiarity check's limits, its probe and the set recall an approximate answer carries (manifests
        # before #32: no check, no probe, and the figure measured over every tuning query)
        familiar = approx.get("familiar") or {}
        self.familiar_limits = {k: v["limit"] for k, v in familiar.items() if isinstance(v, dict) and "limit" in v}
        self.probe_leaves = int(familiar.get("probe_leaves", 0))
        # the band the near-miss limit was measured with (manifests without that statistic have no such limit)
        self.near_band = float((familiar.get("near") or {}).get("band", ts.NEAR_BAND))
        served = (approx.get("served") or {}).get("set_recall_approximate")  # None: no tuning query went approximate
        self.approximate_set_recall = served if served is not None else approx.get("set_recall_min")
        self._exact = None  # ExactSearch over the embeddings, made on first use (checks the gallery once)

    def _exact_rows(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k rows and scores (``ce_retrieval.search.exact``: score descending, ties to the lower
        row, memory bounded by one score block)."""
        if self._exact is None:
            self._exact = ExactSearch(self.embeddings)
        return self._exact(queries, k)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @classmethod
    def load(cls, path: str, expected_model: dict | None = None, mmap: bool = True) -> GalleryIndex:
        """Loads an index folder; with ``expected_model`` (the export metadata), refuses a mismatched one."""
        path = os.path.abspath(path)
        manifest = layout.read_json(os.path.join(path, layout.INDEX_MANIFEST))
        fmt = manifest.get("format")
        if fmt == SHARDED_FORMAT:
            raise IndexMismatchError(
                f"{path} is a sharded index ({fmt}); load it with ce_retrieval.search.sharded.load_index"
            )
        if fmt != INDEX_FORMAT:
            raise IndexMismatchError(f"{path}: unknown index format {fmt!r}, expected {INDEX_FORMAT!r}")
        if expected_model is not None:
            check_compatible(manifest, expected_model, path)
        embeddings = np.load(os.path.join(path, EMBEDDINGS_FILE), mmap_mode="r" if mmap else None)
        ids = np.load(os.path.join(path, IDS_FILE))
        if (
            embeddings.ndim != 2
            or embeddings.shape[0] != manifest["num_items"]
            or ids.shape != (manifest["num_items"],)
        ):
            raise IndexMismatchError(
                f"{path}: arrays ({embeddings.shape}, {ids.shape}) do not match the manifest "
                f"({manifest['num_items']} items)"
            )
        if embeddings.shape[1] != manifest["model"]["embedding_dim"]:
            raise IndexMismatchError(
                f"{path}: embeddings have dimension {embeddings.shape[1]}, manifest says "
                f"{manifest['model']['embedding_dim']}"
            )
        if ids_digest(ids) != manifest["ids"]["sha256"]:
            raise IndexMismatchError(f"{path}: {IDS_FILE} does not match the manifest's checksum")
        parts_path = os.path.join(path, PARTITIONS_FILE)
        partitions = BallPartitions.load(parts_path) if os.path.exists(parts_path) else None
        searcher = None
        if manifest["kind"] == "scann":
            searcher = scann_ops_pybind.load_searcher(os.path.join(path, SCANN_DIR))
        return cls(path, manifest, embeddings, ids, partitions, searcher)

    def topk_rows(
        self,
        queries: np.ndarray,
        k: int,
        *,
        leaves_to_search: int | None = None,
        exact: bool = False,
        reorder: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows [B, k'] and scores [B, k'] (descending), k' = min(k, len(self)). ``reorder``: candidates re-scored
        exactly (default: the tuned depth), at least k."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        k = min(int(k), len(self))
        if self.scann is None or exact:
            return self._exact_rows(queries, k)
        pre = min(len(self), max(int(reorder or self.reorder or 0), k))
        num_leaves = int(self.manifest["params"]["num_leaves"])
        # search enough leaves to hold ~2x the candidates asked for (large k), never more than all of them
        leaves = min(
            num_leaves, max(int(leaves_to_search or self.leaves_to_search), math.ceil(2 * pre * num_leaves / len(self)))
        )
        if len(queries) >= 16:
            rows, scores = self.scann.search_batched_parallel(queries, k, pre, leaves)
        else:
            rows, scores = self.scann.search_batched(queries, k, pre, leaves)
        rows, scores = np.asarray(rows, dtype=np.int64), np.asarray(scores, dtype=np.float32)
        short = ~np.all(np.isfinite(scores), axis=1)  # ScaNN pads with (row 0, NaN) when it found fewer than k
        if short.any():
            rows[short], scores[short] = self._exact_rows(queries[short], k)
        return rows, scores

    def topk(self, queries: np.ndarray, k: int, **kw) -> tuple[np.ndarray, np.ndarray]:
        """Gallery ids [B, k'] and scores [B, k']."""
        rows, scores = self.topk_rows(queries, k, **kw)
        return self.ids[rows], scores

    def threshold_rows(
        self, queries: np.ndarray, threshold: float, *, exact: bool | None = None, limit: int | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per query, rows and scores (descending) of the items with score >= ``threshold`` (``answer_threshold``
        without the answers)."""
        rows, scores, _ = self.answer_threshold_rows(queries, threshold, exact=exact, limit=limit)
        return rows, scores

    def answer_threshold_rows(
        self, queries: np.ndarray, threshold: float, *, exact: bool | None = None, limit: int | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[ThresholdAnswer]]:
        """Per query, rows and scores (descending) of the items with score >= ``threshold``, and how each answer
        was made (:class:`ThresholdAnswer`).

        ``exact=None`` takes the index's default: approximate (``threshold.grow_topk_threshold``) when the
        manifest records its measured set recall meeting the target, exact otherwise; within it, a query is answered
        exactly when the cost model or the familiarity check says so (module docstring). With ``limit`` an
        approximate query stops once it holds more than ``limit`` hits (the caller keeps the best ``limit``)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        tau = float(threshold)
        asked = bool(exact)
        if exact is None:
            exact = self.threshold_params is None
        if exact or self.scann is None:
            rows, scores, _ = exact_threshold_search(queries, self.embeddings, tau, self.partitions)
            return rows, scores, [ThresholdAnswer(True, 1.0, ts.ASKED if asked else ts.INDEX_EXACT)] * len(rows)
        p = self.threshold_params or ThresholdParams(
            start_k=int(self.reorder or 100), max_k=max(1, len(self) // 10), expand_leaves=True
        )
        rows, scores, reasons, _ = self.approximate_threshold_rows(queries, tau, p, limit)
        # without familiarity limits (no threshold partitions) nothing tells a query unlike the tuning ones: say so
        checked = ts.APPROXIMATE if self.familiar_limits else ts.UNCHECKED
        approximate = ThresholdAnswer(False, self.approximate_set_recall, checked)
        answers = [approximate if r == ts.APPROXIMATE else ThresholdAnswer(True, 1.0, r) for r in reasons]
        return rows, scores, answers

    def approximate_threshold_rows(
        self, queries: np.ndarray, tau: float, p: ThresholdParams, limit: int | None = None, checks: bool = True
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[str], dict]:
        """The approximate search with ``p``: grown top-k, then exact scores in the leaves holding a found hit
        (``p.expand_leaves``) and in the probe leaves (``self.probe_leaves`` of them); with ``checks``, the cost
        model and the familiarity check send queries to the exact search. Returns rows, scores, each query's reason
        (``threshold.APPROXIMATE`` or why it was answered exactly) and the familiarity statistics (NaN for
        queries the rounds did not answer; empty without partitions). The build tunes with ``checks=False``."""
        costs = self.threshold_costs(len(queries)) if checks else None
        rows, scores, stats = grow_topk_threshold(
            queries, tau, self._threshold_topk(p), self._exact_threshold, p, limit, costs
        )
        reasons = np.where(stats["exact"], ts.COST, ts.APPROXIMATE).astype(object)
        live = np.flatnonzero(~stats["exact"])  # answered by the rounds (the others are exact already)
        if self.partitions is None:
            return rows, scores, list(reasons), {}
        found = [rows[i] for i in live]
        have = hit_leaves(self.partitions, found)
        familiar = {name: np.full(len(rows), np.nan) for name in ("spread", "missed", "near")}  # NaN: not measured
        familiar["spread"][live] = spread(found, have)
        if checks and "spread" in self.familiar_limits:  # known now: such a query skips the leaf scoring and probe
            reasons[live[familiar["spread"][live] > self.familiar_limits["spread"]]] = ts.UNFAMILIAR
        go = np.flatnonzero(reasons[live] == ts.APPROXIMATE)  # positions in `live` still answered approximately
        found, have = [found[j] for j in go], [have[j] for j in go]
        probe = probe_leaves(self.partitions, queries[live[go]], have, self.probe_leaves)
        leaves = [np.union1d(h, v) if p.expand_leaves else v for h, v in zip(have, probe, strict=True)]
        if checks:
            sizes = np.diff(self.partitions.offsets)
            items = np.array([sizes[v].sum() for v in leaves], dtype=np.int64)
            reasons[live[go[stats["spent"][live[go]] + costs.expansion(items) > costs.exact]]] = ts.COST
        scored = [j for j, i in enumerate(live[go]) if reasons[i] == ts.APPROXIMATE and len(leaves[j])]
        if scored:
            got_rows, got_scores, near = score_leaves_near(
                queries[live[go[scored]]],
                tau,
                [leaves[j] for j in scored],
                self.embeddings,
                self.partitions,
                self.near_band,
            )
            familiar["near"][live[go[scored]]] = near_misses(near, [len(r) for r in got_rows])
            for k, j in enumerate(scored):
                i = live[go[j]]
                rows[i], scores[i] = _with_found(got_rows[k], got_scores[k], rows[i], scores[i], p.expand_leaves)
        familiar["missed"][live[go]] = missed(self.partitions, found, probe, [rows[i] for i in live[go]])
        for name, why in (("missed", ts.UNFAMILIAR_MISSED), ("near", ts.UNFAMILIAR_NEAR)):
            if checks and name in self.familiar_limits:
                reasons[(reasons == ts.APPROXIMATE) & (familiar[name] > self.familiar_limits[name])] = why
        redo = np.flatnonzero((reasons != ts.APPROXIMATE) & ~stats["exact"])
        if len(redo):
            got_rows, got_scores = self._exact_threshold(queries[redo], tau)
            for j, i in enumerate(redo):
                rows[i], scores[i] = got_rows[j], got_scores[j]
        return rows, scores, list(reasons), familiar

    def threshold_costs(self, batch: int) -> CostModel:
        """The cost model of this index's approximate search for a batch of ``batch`` queries
        (``threshold.CostModel``)."""
        params = self.manifest["params"]
        return CostModel(len(self), int(params["num_leaves"]), int(params["leaves_to_search"]), batch)

    def _threshold_topk(self, p: ThresholdParams):
        num_leaves = int(self.manifest["params"]["num_leaves"])

        def topk(q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            leaves = scann_leaves(int(self.leaves_to_search), num_leaves, len(self), k, p)
            return self.topk_rows(q, k, leaves_to_search=leaves, reorder=math.ceil(p.reorder_factor * k))

        return topk

    def _exact_threshold(self, q: np.ndarray, tau: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
        rows, scores, _ = exact_threshold_search(q, self.embeddings, tau, self.partitions)
        return rows, scores

    def answer_threshold(
        self, queries: np.ndarray, threshold: float, *, exact: bool | None = None, limit: int | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[ThresholdAnswer]]:
        """Per query, ids, scores (descending) and how the answer was made (see ``answer_threshold_rows``)."""
        rows, scores, answers = self.answer_threshold_rows(queries, threshold, exact=exact, limit=limit)
        return [self.ids[r] for r in rows], scores, answers


def _with_found(rows, scores, found_rows, found_scores, covered: bool) -> tuple[np.ndarray, np.ndarray]:
    """The leaf-scored hits, plus the rounds' hits where those leaves did not cover them (``covered``: the leaves
    held every found hit), ordered by score descending then row."""
    if covered:
        return rows, scores
    rows, scores = np.concatenate([found_rows, rows]), np.concatenate([found_scores, scores]).astype(np.float32)
    order = np.lexsort((rows, -scores))
    return rows[order], scores[order]


def check_compatible(manifest: dict, export_meta: dict, where: str = "index") -> None:
    """Raises ``IndexMismatchError`` unless the index was built by exactly this exported model."""
    model = manifest.get("model", {})
    if model.get("embedding_dim") != export_meta.get("embedding_dim"):
        raise IndexMismatchError(
            f"{where}: index embedding dimension {model.get('embedding_dim')} != model's "
            f"{export_meta.get('embedding_dim')}"
        )
    if model.get("normalization") != export_meta.get("normalization", "l2"):
        raise IndexMismatchError(
            f"{where}: index normalisation {model.get('normalization')!r} != model's "
            f"{export_meta.get('normalization')!r}"
        )
    if model.get("fingerprint") != export_meta.get("fingerprint"):
        raise IndexMismatchError(
            f"{where}: index was built for model fingerprint {str(model.get('fingerprint'))[:12]}, "
            f"this model is {str(export_meta.get('fingerprint'))[:12]}; rebuild the index "
            "(ce-retrieval index) for this export version"
        )
