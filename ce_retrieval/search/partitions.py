"""Ball partitions of a unit-norm gallery for *exact* threshold search ("every item with score >= tau").

An approximate index answers top-k well but cannot promise that it returns every item above a threshold.
We therefore split the gallery into L leaves with spherical k-means (L ~ sqrt(n)) and store, per leaf l,
its mean c_l and radius r_l = max_{x in l} ||x - c_l||. For a unit query q and any member x of leaf l,

    q.x = q.c_l + q.(x - c_l) <= q.c_l + r_l                              (Cauchy-Schwarz, ||q|| = 1)
    ||q - x|| >= ||q - c_l|| - r_l, and q.x >= tau  <=>  ||q - x||^2 <= 2 - 2 tau   (unit vectors)

so a leaf can hold an item with q.x >= tau only if  q.c_l + r_l >= tau  and  ||q - c_l|| - r_l <= sqrt(2 - 2 tau).
Leaves failing either bound are skipped; every member of the others is scored exactly and cut at tau. Nothing
above tau is ever skipped, so the result equals brute force, while far-away leaves cost one dot product each.

How the admitted leaves are scored decides whether pruning can win, so each batch of queries (batched by nearest
leaf, so that they admit similar leaves) picks the cheapest of three plans from the bounds, before scoring:

    scan    B x n dot products in large blocks (BLAS at full speed)
    union   B x |union of admitted leaves| dot products, the rows gathered into large blocks
    pairs   each admitted leaf against only the queries admitting it: sum of pairs dot products, but one small
            matrix product per leaf, which BLAS runs far below its large-matrix speed (measured on 2 cores,
            d = 128, 450-row leaves: 2x the per-dot cost of a scan with 8 queries, up to 10-90x with 16-64 under
            load, where the multi-threaded kernel starts), plus a fixed cost per leaf (the Python loop)

with costs ``scan = B n``, ``union = _GATHER_COST B |union|``, ``pairs = _SMALL_PRODUCT_COST sum(pairs) +
_LEAF_COST #leaves`` in dot products. On diffuse high-dimensional data the bounds admit most leaves and the
batch is a plain scan, so exact search costs at most the scan plus the bounds (B x L dot products, L ~ sqrt n).

The scan itself (:func:`scan_hits`) splits the gallery's blocks over one worker thread per core, each running
single-threaded BLAS: a NumPy scan runs its product on every core but the cut at tau (``np.nonzero(block >=
tau)``) on one, while the workers overlap one block's cut with another's product.

Members of a leaf are stored contiguously (the index keeps the gallery in leaf order), so a leaf is a slice.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading

import numpy as np
from threadpoolctl import ThreadpoolController

_SLACK = 1e-4  # float32 rounding in the bounds; it only ever adds leaves, never drops one
# Plan costs in dot products of a large scan (module docstring). In high dimension with diffuse leaves the bounds
# admit almost everything (Cauchy-Schwarz is loose by ~sqrt(d) for residuals orthogonal to q); they pay off for
# tight clusters / low intrinsic dimension and selective thresholds.
_GATHER_COST = 1.3  # a gathered row: the copy, then the same large product
_SMALL_PRODUCT_COST = 4.0  # a dot product inside one leaf's small matrix product
_LEAF_COST = 4096.0  # per leaf of the pairs plan: ~20 us of Python and small-array overhead
_BLOCK_ELEMENTS = 1 << 22  # scores per product block (16 MiB of float32)
_SCAN_BATCH = 256  # queries scanned together: each pass over the gallery serves more of them
_SCAN_BLOCK_ROWS = 16384  # gallery rows per block of the worker scan (8 MiB of float32 at d = 128: cache-sized)
SCAN_WORKERS = max(1, min(8, os.cpu_count() or 1))


@dataclasses.dataclass
class BallPartitions:
    offsets: np.ndarray  # int64 [L + 1]: leaf l is rows offsets[l]:offsets[l+1] of the leaf-ordered gallery
    centers: np.ndarray  # float32 [L, d] (means, not normalised)
    radii: np.ndarray  # float32 [L]

    @property
    def num_leaves(self) -> int:
        return len(self.radii)

    def candidate_leaves(self, queries: np.ndarray, threshold: float, qc: np.ndarray | None = None) -> np.ndarray:
        """bool [B, L]: leaves that may hold an item scoring >= threshold for each query (``qc``: the queries'
        products with the centres, when already computed)."""
        qc = queries @ self.centers.T if qc is None else qc
        dot_ok = qc + self.radii[None, :] >= threshold - _SLACK
        dist_sq = np.maximum(1.0 - 2.0 * qc + np.sum(self.centers**2, axis=1)[None, :], 0.0)
        ball_ok = np.sqrt(dist_sq) - self.radii[None, :] <= np.sqrt(max(2.0 - 2.0 * threshold, 0.0)) + _SLACK
        return dot_ok & ball_ok

    def save(self, path: str) -> None:
        np.savez(path, offsets=self.offsets, centers=self.centers, radii=self.radii)

    @classmethod
    def load(cls, path: str) -> BallPartitions:
        with np.load(path) as z:
            return cls(z["offsets"].astype(np.int64), z["centers"].astype(np.float32), z["radii"].astype(np.float32))


_ASSIGN_ROWS = 1024  # rows scored against every centre at once: [1024, L] float32 (32 MB at L = 7,812)


def _assign(x: np.ndarray, unit_centers: np.ndarray, chunk: int = _ASSIGN_ROWS) -> np.ndarray:
    """The nearest centre (largest dot product) of each row. Small chunks: each score block is written by the
    product and read back by the argmax while still in cache, instead of the whole n x L score matrix going through
    memory twice (65,536-row chunks made 2 GB blocks at L = 7,812)."""
    out = np.empty(len(x), dtype=np.int64)
    for s in range(0, len(x), chunk):
        out[s : s + chunk] = np.argmax(np.asarray(x[s : s + chunk]) @ unit_centers.T, axis=1)
    return out


def _leaf_sums(x: np.ndarray, assign: np.ndarray, num_leaves: int) -> tuple[np.ndarray, np.ndarray]:
    """``(sums [L, d], counts [L])`` of the rows of each leaf: the rows sorted by leaf and summed by
    ``np.add.reduceat`` (``np.add.at`` adds one row at a time)."""
    counts = np.bincount(assign, minlength=num_leaves)
    sums = np.zeros((num_leaves, x.shape[1]), dtype=np.float64)
    full = counts > 0
    if full.any():
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[full]
        sums[full] = np.add.reduceat(x[np.argsort(assign, kind="stable")], starts, axis=0, dtype=np.float64)
    return sums, counts


def spherical_kmeans(
    x: np.ndarray, num_leaves: int, *, iterations: int = 8, sample_size: int = 100_000, seed: int = 0
) -> np.ndarray:
    """Unit-norm centroids [num_leaves, d] fitted on a sample of ``x`` (assignment by largest dot product)."""
    rng = np.random.default_rng(seed)
    sample = np.asarray(x[np.sort(rng.choice(len(x), size=min(len(x), sample_size), replace=False))])
    num_leaves = min(num_leaves, len(sample))
    centers = sample[rng.choice(len(sample), size=num_leaves, replace=False)].copy()
    for _ in range(iterations):
        sums, counts = _leaf_sums(sample, _assign(sample, centers), num_leaves)
        empty = counts == 0
        sums[empty] = sample[rng.choice(len(sample), size=int(empty.sum()), replace=False)]
        centers = (sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)).astype(np.float32)
    return centers


def build_partitions(
    x: np.ndarray, num_leaves: int, *, seed: int = 0, ordered: bool = False
) -> tuple[np.ndarray, BallPartitions] | tuple[np.ndarray, BallPartitions, np.ndarray]:
    """Returns ``(order, partitions)``: ``x[order]`` is the gallery in leaf order that ``partitions`` describes;
    with ``ordered``, ``(order, partitions, x[order])`` (the copy it made anyway, which a caller would make again)."""
    x = np.asarray(x, dtype=np.float32)
    centers = spherical_kmeans(x, max(1, num_leaves), seed=seed)
    assign = _assign(x, centers)
    order = np.argsort(assign, kind="stable")
    counts = np.bincount(assign, minlength=len(centers))
    counts = counts[counts > 0]  # drop empty leaves
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    xs = x[order]
    means = np.add.reduceat(xs, offsets[:-1], axis=0) / counts[:, None]
    leaf_of_row = np.repeat(np.arange(len(counts)), counts)
    dists = np.empty(len(xs), dtype=np.float32)
    for s in range(0, len(xs), 65536):
        dists[s : s + 65536] = np.linalg.norm(xs[s : s + 65536] - means[leaf_of_row[s : s + 65536]], axis=1)
    radii = np.maximum.reduceat(dists, offsets[:-1])
    partitions = BallPartitions(offsets, means.astype(np.float32), radii.astype(np.float32))
    return (order, partitions, xs) if ordered else (order, partitions)


def leaf_of_rows(partitions: BallPartitions, rows: np.ndarray) -> np.ndarray:
    """The leaf of each row of the leaf-ordered gallery."""
    return np.searchsorted(partitions.offsets, rows, side="right") - 1


def union_rows(partitions: BallPartitions, leaves: np.ndarray) -> np.ndarray:
    """Rows of the leaf-ordered gallery in the given leaves (ascending), without a Python loop over leaves."""
    starts, ends = partitions.offsets[leaves], partitions.offsets[leaves + 1]
    sizes = ends - starts
    first = np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
    return first + np.arange(int(sizes.sum()))


def _plan(partitions: BallPartitions, cand: np.ndarray, n: int) -> tuple[str, object]:
    """The cheapest way to score one batch whose admitted leaves are ``cand`` (bool [B, L]): ``("scan", None)``,
    ``("union", rows)`` or ``("pairs", cand)``."""
    b = len(cand)
    sizes = np.diff(partitions.offsets)
    leaves = np.flatnonzero(cand.any(axis=0))
    costs = {
        "scan": float(b * n),
        "union": _GATHER_COST * b * float(sizes[leaves].sum()),
        "pairs": _SMALL_PRODUCT_COST * float(cand.sum(axis=0) @ sizes) + _LEAF_COST * len(leaves),
    }
    plan = min(costs, key=costs.get)
    if plan == "union":
        return plan, union_rows(partitions, leaves)
    return plan, cand if plan == "pairs" else None


def _blocks(plan: str, what, q: np.ndarray, gallery: np.ndarray, offsets):
    """``(query indices, score block, gallery rows of its columns)`` for each product of a union or pairs plan."""
    if plan == "pairs":
        for leaf in np.flatnonzero(what.any(axis=0)):
            s, e = offsets[leaf], offsets[leaf + 1]
            qi = np.flatnonzero(what[:, leaf])
            yield qi, q[qi] @ gallery[s:e].T, np.arange(s, e)
        return
    everyone = np.arange(len(q))
    block_rows = max(4096, _BLOCK_ELEMENTS // max(1, len(q)))
    for s in range(0, len(what), block_rows):
        yield everyone, q @ gallery[what[s : s + block_rows]].T, what[s : s + block_rows]


def _plan_hits(plan: str, what, q: np.ndarray, gallery: np.ndarray, offsets, threshold: float):
    """``(query indices, rows, scores, scores computed)`` of the hits of a union or pairs plan."""
    hit_q, hit_row, hit_s, scored = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)], 0
    for qi, block, where in _blocks(plan, what, q, gallery, offsets):
        scored += block.size
        bi, ri, hs = cut_at(block, threshold)
        hit_q.append(qi[bi])
        hit_row.append(where[ri])
        hit_s.append(hs)
    return np.concatenate(hit_q), np.concatenate(hit_row), np.concatenate(hit_s), scored


_SMALL_CUT = 4096  # scores: a block this small is cut whole (cut_at)


def cut_at(block: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, columns, scores)`` of the entries of a score block ``>= threshold``, row-major (``np.nonzero``'s
    order).

    A threshold query keeps a few entries of each block (hits / n of them), and comparing and compacting every
    entry costs about a third of the block's product (d = 128). The columns' maxima (a reduction over contiguous
    rows, vectorised; NaN ignored) say which columns hold a hit; only those are compared and compacted. Measured
    at 1M x 128, 200 queries, 2 workers: the scan's product 0.41 s, with the full cut 0.54 s, with this cut
    0.39-0.41 s. Where many columns hold a hit (a low threshold) the full cut is cheaper than the gather and is
    used, and so is it for blocks of at most ``_SMALL_CUT`` scores (measured: 3-7 us against 9-12 us for blocks of
    128-1,200 scores, the per-leaf blocks of the pairs plan)."""
    if block.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, block.dtype)
    columns = None
    if block.size > _SMALL_CUT:  # a leaf's block is cut whole: the column pass's extra calls cost more than they save
        columns = np.flatnonzero(np.fmax.reduce(block, axis=0) >= threshold)  # fmax: a NaN entry hides no hit
    if columns is None or 4 * len(columns) > block.shape[1]:
        bi, ri = np.nonzero(block >= threshold)
        return bi, ri, block[bi, ri]
    sub = block[:, columns]
    bi, ci = np.nonzero(sub >= threshold)
    return bi, columns[ci], sub[bi, ci]


_BLAS = ThreadpoolController()  # inspects the loaded BLAS libraries once (a new one per call costs milliseconds)
_SCAN_LOCK = threading.Lock()  # one worker scan at a time: each takes every core
_SCAN_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def scan_hits(queries: np.ndarray, gallery: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(query indices, rows, scores)`` of every ``q.x >= threshold`` by a scan of the whole gallery.

    Blocks of ``_SCAN_BLOCK_ROWS`` rows are split over ``SCAN_WORKERS`` threads (one per core), BLAS limited to
    one thread meanwhile (the limit is process-wide: another thread's product in that time runs on one core too).
    Each block costs ``B x rows`` multiply-adds of d and one cut at tau; a NumPy scan with multi-threaded BLAS
    runs the cut on one core while the others wait (``benchmarks/results/threshold_methods.md``: 2 workers on 2
    cores 1.36x the NumPy scan at 1M)."""
    global _SCAN_POOL
    starts = range(0, len(gallery), _SCAN_BLOCK_ROWS)

    def work(s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        bi, ri, hs = cut_at(queries @ gallery[s : s + _SCAN_BLOCK_ROWS].T, threshold)
        return bi, ri + s, hs

    if min(SCAN_WORKERS, len(starts)) <= 1:
        got = [work(s) for s in starts]
    else:
        with _SCAN_LOCK:
            if _SCAN_POOL is None:
                _SCAN_POOL = concurrent.futures.ThreadPoolExecutor(SCAN_WORKERS, thread_name_prefix="scan")
            with _BLAS.limit(limits=1, user_api="blas"):  # one block a task: a worker slowed by another process
                got = list(_SCAN_POOL.map(work, starts))  # takes fewer blocks instead of holding the others up
    if not got:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    return tuple(np.concatenate([g[i] for g in got]) for i in range(3))


def exact_threshold_search(
    queries: np.ndarray,
    gallery: np.ndarray,
    threshold: float,
    partitions: BallPartitions | None = None,
    query_batch: int = 64,
    leaves: np.ndarray | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """Exact: for each query, rows of ``gallery`` with ``q.x >= threshold``, sorted by score (descending, ties by
    row).

    ``leaves`` (bool ``[B, L]``, with ``partitions``) restricts query b to the leaves ``leaves[b]`` in place of the
    ball bounds' admitted leaves: the answer is then every item above the threshold *in those leaves* and no other
    (exactly scored, by the same plans; whatever the plan, so it does not depend on the batch), which is how the
    approximate search expands its hits to their leaf-mates.

    Returns ``(rows, scores, scored)`` where ``scored`` counts the exact dot products computed (for stats).
    With partitions, queries are batched by their nearest leaf and each batch is scored by the cheapest plan
    (scan, union of admitted leaves, or per-leaf pairs; module docstring); without, by a blocked scan. Scans serve
    up to ``_SCAN_BATCH`` queries per pass over the gallery.
    """
    queries = np.asarray(queries, dtype=np.float32)
    # a memory-mapped gallery as a plain ndarray view (no copy): every product and comparison on an np.memmap
    # slice returns an np.memmap and pays its subclass overhead (measured: ~25 % of a 50k x 128 search)
    gallery = np.asarray(gallery)
    rows: list[np.ndarray] = [np.zeros(0, np.int64)] * len(queries)
    scores: list[np.ndarray] = [np.zeros(0, np.float32)] * len(queries)
    scored = 0
    n = len(gallery)
    by_leaf, cand = np.arange(len(queries)), None
    if leaves is not None and partitions is None:
        raise ValueError("exact_threshold_search: `leaves` needs the partitions that number them")
    if partitions is not None:  # bounds of every query in one product (many small products stall BLAS threads)
        qc = queries @ partitions.centers.T
        cand = partitions.candidate_leaves(queries, threshold, qc) if leaves is None else np.asarray(leaves, bool)
        by_leaf = np.argsort(np.argmax(qc, axis=1), kind="stable")  # a batch's queries admit similar leaves
    for batch, plan, what in _batches(by_leaf, cand, partitions, n, query_batch):
        q = queries[batch]
        if plan == "scan":
            hq, hr, hs = scan_hits(q, gallery, threshold)
            scored += len(q) * n
        else:
            hq, hr, hs, block_scores = _plan_hits(plan, what, q, gallery, partitions.offsets, threshold)
            scored += block_scores
        if leaves is not None:  # a scan or union plan also scores rows outside a query's own leaves: drop them
            own = cand[batch[hq], leaf_of_rows(partitions, hr)]
            hq, hr, hs = hq[own], hr[own], hs[own]
        order = np.lexsort((hr, -hs, hq))  # by query, then score descending, then row
        hq, hr, hs = hq[order], hr[order], hs[order]
        bounds = np.searchsorted(hq, np.arange(len(q) + 1))
        for i, query in enumerate(batch):
            rows[query] = hr[bounds[i] : bounds[i + 1]].astype(np.int64)
            scores[query] = hs[bounds[i] : bounds[i + 1]].astype(np.float32)
    return rows, scores, scored


def _batches(by_leaf: np.ndarray, cand, partitions, n: int, query_batch: int):
    """``(query indices, plan, plan data)``: ``query_batch`` batches planned one by one; consecutive batches whose
    cheapest plan is a scan are scanned together, up to ``_SCAN_BATCH`` queries (one pass over the gallery for
    all of them)."""
    scan: list[np.ndarray] = []
    for b in range(0, len(by_leaf), query_batch):
        batch = by_leaf[b : b + query_batch]
        plan, what = ("scan", None) if cand is None else _plan(partitions, cand[batch], n)
        if plan != "scan":
            yield batch, plan, what
            continue
        scan.append(batch)
        if sum(len(x) for x in scan) + query_batch > _SCAN_BATCH:
            yield np.concatenate(scan), "scan", None
            scan = []
    if scan:
        yield np.concatenate(scan), "scan", None
