"""Ball partitions of a unit-norm gallery for *exact* threshold search ("every item with score >= tau").

An approximate index answers top-k well but cannot promise that it returns every item above a threshold.
We therefore split the gallery into L leaves with spherical k-means (L ~ sqrt(n)) and store, per leaf l,
its mean c_l and radius r_l = max_{x in l} ||x - c_l||. For a unit query q and any member x of leaf l,

    q.x = q.c_l + q.(x - c_l) <= q.c_l + r_l                              (Cauchy-Schwarz, ||q|| = 1)
    ||q - x|| >= ||q - c_l|| - r_l, and q.x >= tau  <=>  ||q - x||^2 <= 2 - 2 tau   (unit vectors)

so a leaf can hold an item with q.x >= tau only if  q.c_l + r_l >= tau  and  ||q - c_l|| - r_l <= sqrt(2 - 2 tau).
Leaves failing either bound are skipped; every member of the others is scored exactly and cut at tau. Nothing
above tau is ever skipped, so the result equals brute force, while far-away leaves cost one dot product each.
When the bounds admit most leaves (diffuse data, low tau) the batch falls back to one chunked brute-force pass.

Members of a leaf are stored contiguously (the index keeps the gallery in leaf order), so a leaf is a slice.
"""

from __future__ import annotations

import dataclasses

import numpy as np

_SLACK = 1e-4  # float32 rounding in the bounds; it only ever adds leaves, never drops one
# Above this share of admitted (query, leaf) pairs one large matmul beats many small ones. In high dimension
# with diffuse leaves the bounds admit almost everything (Cauchy-Schwarz is loose by ~sqrt(d) for residuals
# orthogonal to q); they pay off for tight clusters / low intrinsic dimension and selective thresholds.
_BRUTE_FORCE_ABOVE = 0.3


@dataclasses.dataclass
class BallPartitions:
    offsets: np.ndarray  # int64 [L + 1]: leaf l is rows offsets[l]:offsets[l+1] of the leaf-ordered gallery
    centers: np.ndarray  # float32 [L, d] (means, not normalised)
    radii: np.ndarray  # float32 [L]

    @property
    def num_leaves(self) -> int:
        return len(self.radii)

    def candidate_leaves(self, queries: np.ndarray, threshold: float) -> np.ndarray:
        """bool [B, L]: leaves that may hold an item scoring >= threshold for each query."""
        qc = queries @ self.centers.T
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


def _assign(x: np.ndarray, unit_centers: np.ndarray, chunk: int = 65536) -> np.ndarray:
    out = np.empty(len(x), dtype=np.int64)
    for s in range(0, len(x), chunk):
        out[s : s + chunk] = np.argmax(x[s : s + chunk] @ unit_centers.T, axis=1)
    return out


def spherical_kmeans(
    x: np.ndarray, num_leaves: int, *, iterations: int = 8, sample_size: int = 100_000, seed: int = 0
) -> np.ndarray:
    """Unit-norm centroids [num_leaves, d] fitted on a sample of ``x`` (assignment by largest dot product)."""
    rng = np.random.default_rng(seed)
    sample = x[rng.choice(len(x), size=min(len(x), sample_size), replace=False)]
    num_leaves = min(num_leaves, len(sample))
    centers = sample[rng.choice(len(sample), size=num_leaves, replace=False)].copy()
    for _ in range(iterations):
        assign = _assign(sample, centers)
        sums = np.zeros_like(centers)
        np.add.at(sums, assign, sample)
        counts = np.bincount(assign, minlength=num_leaves)
        empty = counts == 0
        sums[empty] = sample[rng.choice(len(sample), size=int(empty.sum()), replace=False)]
        centers = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
    return centers.astype(np.float32)


def build_partitions(x: np.ndarray, num_leaves: int, *, seed: int = 0) -> tuple[np.ndarray, BallPartitions]:
    """Returns ``(order, partitions)``: ``x[order]`` is the gallery in leaf order that ``partitions`` describes."""
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
    return order, BallPartitions(offsets, means.astype(np.float32), radii.astype(np.float32))


def threshold_search(
    queries: np.ndarray,
    gallery: np.ndarray,
    threshold: float,
    partitions: BallPartitions | None = None,
    query_batch: int = 64,
) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """Exact: for each query, rows of ``gallery`` with ``q.x >= threshold``, sorted by score (descending).

    Returns ``(rows, scores, scored)`` where ``scored`` counts the exact dot products computed (for stats).
    With partitions, each leaf is scored only against the queries whose bounds admit it; without, the whole
    gallery is scored (chunked, bounded memory).
    """
    queries = np.asarray(queries, dtype=np.float32)
    rows: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    scored = 0
    for b in range(0, len(queries), query_batch):
        q = queries[b : b + query_batch]
        hit_q, hit_row, hit_s = [], [], []
        cand = None if partitions is None else partitions.candidate_leaves(q, threshold)
        if cand is None or cand.mean() > _BRUTE_FORCE_ABOVE:  # brute force, chunked
            work = [(np.arange(len(q)), s, min(len(gallery), s + 65536)) for s in range(0, len(gallery), 65536)]
        else:  # each surviving (leaf, queries) pair: only the queries whose bounds admit the leaf
            work = [
                (np.flatnonzero(cand[:, leaf]), partitions.offsets[leaf], partitions.offsets[leaf + 1])
                for leaf in np.flatnonzero(cand.any(axis=0))
            ]
        for qi, s, e in work:
            block = q[qi] @ gallery[s:e].T
            scored += block.size
            bi, ri = np.nonzero(block >= threshold)
            hit_q.append(qi[bi])
            hit_row.append(ri + s)
            hit_s.append(block[bi, ri])
        hq = np.concatenate(hit_q) if hit_q else np.zeros(0, np.int64)
        hr = np.concatenate(hit_row) if hit_row else np.zeros(0, np.int64)
        hs = np.concatenate(hit_s) if hit_s else np.zeros(0, np.float32)
        order = np.lexsort((-hs, hq))  # by query, then score descending
        hq, hr, hs = hq[order], hr[order], hs[order]
        bounds = np.searchsorted(hq, np.arange(len(q) + 1))
        for i in range(len(q)):
            rows.append(hr[bounds[i] : bounds[i + 1]])
            scores.append(hs[bounds[i] : bounds[i + 1]].astype(np.float32))
    return rows, scores, scored
