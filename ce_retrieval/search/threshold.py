"""Approximate threshold search ("every item with q.x >= tau") whose cost follows the number of hits.

Exact threshold search has to look at every item that *might* clear tau. On high-dimensional, diffuse data no
cheap bound rules many items out (``partitions``: the ball bounds admit most leaves), so it degenerates into a
scan of the whole gallery, while a top-k query costs a few leaves of the ANN index. Threshold queries are
therefore answered by top-k with k grown geometrically:

    k_0 = start_k (the ANN's re-ranking depth: the candidates a top-10 query re-scores anyway),
    k_{i+1} = growth * k_i   while the k_i-th exact re-scored score s_(k_i) >= tau,

and the answer is every returned item with s >= tau. ScaNN re-scores its candidates exactly, so every returned
score is exact and nothing below tau is returned; an item above tau is missed only when the ANN ranks it below
the k-th candidate. The stop is strict (s_(k) < tau), so items tied at tau are never cut between two rounds.
Cost is about top-k at the final k times log_growth(hits / start_k) rounds, i.e. it follows the hits, not n.
Past ``max_k`` (a tenth of the gallery by default), or earlier where the cost model below says a scan is cheaper
than more ANN rounds, the remaining queries are answered exactly. With ``limit`` L a query stops growing once it
holds more than L hits (its best L are what is returned; one more tells the caller the answer was cut).

Then the leaf expansion (``expand_to_leaves``, ``ThresholdParams.expand_leaves``): with H_q the hits found and
P(x) the threshold-partition leaf of item x (a k-means of ~128 items per leaf, finer than the ANN's leaves),

    A_q = { x : P(x) in P(H_q), q.x >= tau }      (every member of those leaves scored exactly),

a superset of H_q: a query's hits are near each other and share small leaves, while the ANN ranks its own larger
leaves by their centres and misses the hits of leaves it ranks low. An item above tau is then missed only when no
hit of its partition leaf was found.

What the index promises is a *measured* figure: at build time the set recall

    set recall(tau) = sum_q |A_q(tau) & E_q(tau)| / sum_q |E_q(tau)|      (A: approximate, E: exact answer)

is measured on held-out evaluation queries at each calibrated threshold, the first ``(leaves_factor,
reorder_factor, expand_leaves)`` of the tuning walk whose set recall has a lower 95 % bound over the queries
(queries as clusters of hits: ``set_recall_lower_bound``) at or above the target (0.99) is chosen
(``tune_threshold_params``), and the figures go in the manifest (``threshold_search``). The bound covers the
sampling of the tuning queries, not traffic unlike them: that is the per-query familiarity check's job (below).
``exact=True`` (or an index without such a measurement) uses the exact search.

Two per-query checks keep the approximate search from losing to the exact one (issue #32):

* **Cost** (:class:`CostModel`): costs per query in units of one (query, item) product of a batched scan,

      round(k)  = QUANTISED_ITEM x items in the searched ScaNN leaves + RESCORED_ITEM x ceil(reorder_factor k),
      expansion = EXPANDED_ITEM x members of the expanded and probed leaves,
      exact     = n (1 + SCAN_READ / B)      (a batch of B queries reads the gallery once),

  and a round runs only while the query's spent cost plus the round's stays within ``BUDGET x exact``, the
  leaf scoring after the rounds only while the total stays within ``exact``; otherwise the query is answered
  exactly. A query answered approximately therefore costs at most one exact search, and one that switches at most
  ``1 + BUDGET`` of them (what it spent, then the scan); where the first round alone would cost more than
  ``BUDGET x exact`` (a small gallery, or a tuning that searches most leaves) every query is answered exactly
  without a round. ``BUDGET`` < 1 trades the queries that would have finished between ``BUDGET`` and 1 exact
  search (answered exactly instead, at 1 to 1 + ``BUDGET``) for a lower worst case: measured at 200k, where the
  tuned first round cost 0.9 of a scan, ``BUDGET`` = 1 let half the queries pay that round and then the scan.
* **Familiarity** (:func:`spread`, :func:`missed`, :func:`near_misses`): three statistics of what the search
  found, each over (hits + SPREAD_PRIOR). Past the ``FAMILIAR_QUANTILE`` of the tuning queries' values of any of
  them (``familiar`` in the manifest) the query is answered exactly.

  - ``spread``: the partition leaves holding the found hits; small when the hits share leaves (the expansion then
    recovers the rest), near 1 when each lies in its own leaf (queries unlike the gallery's, whose hits the
    expansion cannot reach: ``benchmarks/results/threshold_leaves.md``). Known when the rounds end, so a query past
    its limit skips the leaf scoring and the probe (``UNFAMILIAR``).
  - ``missed``: the hits in the ``PROBE_LEAVES`` leaves of highest mean score that held no found hit
    (:func:`probe_leaves`, scored exactly for every approximate answer, their hits kept); hits there are hits the
    rounds missed, which happens where the quantised scores mislead (queries far from the gallery's clusters).
    Its verdict comes after the leaf scoring (``UNFAMILIAR_MISSED``).
  - ``near``: the items of the scored leaves (expanded and probed) whose score lies in the band just below the
    threshold, per hit there (``UNFAMILIAR_NEAR``, with the probe's verdict),

        near_q = |{x scored : tau - NEAR_BAND <= q.x < tau}| / (|{x scored : q.x >= tau}| + SPREAD_PRIOR),

    large when the hits are the top of a dense band of near-misses rather than a neighbourhood of their own:
    there a quantisation error of a few hundredths reorders hits and near-misses, so the ANN's candidates miss
    hits that no leaf near a found hit and no probe leaf holds. The other two miss such queries where the leaves
    are coarse (10M items in 8,192 leaves: a sixth of the other-cluster queries passed both,
    ``benchmarks/results/threshold_search_issue32_10000000_cut.md``).

Each query's answer says which path made it (:class:`ThresholdAnswer`): exact, or approximate with the set recall
measured on the tuning queries the index answered approximately.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from ce_retrieval.search.exact import exact_search
from ce_retrieval.search.partitions import BallPartitions, leaf_of_rows, union_rows
from ce_retrieval.utils.proportions import clustered_lower_bound

__all__ = [
    "CostModel",
    "ThresholdAnswer",
    "ThresholdParams",
    "expand_to_leaves",
    "grow_topk_threshold",
    "merge_answers",
    "missed",
    "near_misses",
    "probe_leaves",
    "score_leaves",
    "score_leaves_near",
    "set_recall",
    "set_recall_lower_bound",
    "spread",
    "tune_threshold_params",
]

GROWTH = 4
# The tuning walks leaves factors upwards and, at each, deepens the re-scoring (x 2) until the target is met or
# re-scoring stops helping (set recall up by < REORDER_SATURATION), then moves to more leaves, starting from the
# re-scoring depth that saturated. Leaves dominate the cost (each extra leaf is n / L items' quantised scores;
# re-scoring r k candidates costs r k d flops, 0.4 MFLOP for r k = 3,200, d = 128) and what they buy is the hits'
# coverage: on the benchmark's hard gallery, with the top-10 setting's leaves deeper re-scoring stops helping well
# short of the target and more leaves are what raise set recall (the walk is in each manifest's ``tuning``). Fine
# leaves steps matter: between 2x and 4x the leaves a query costs 1.5-2x more. Deep re-scoring is what queries
# unlike the gallery need (the 4-bit scores are least accurate far from the gallery's clusters).
LEAVES_FACTORS = (1, 1.5, 2, 3, 4, 6, 8)
REORDER_FACTORS = (1, 2, 4, 8, 16, 32, 64)
REORDER_SATURATION = 0.002


@dataclasses.dataclass
class ThresholdParams:
    """How an ANN index answers threshold queries (stored in the manifest's ``threshold_search``)."""

    start_k: int  # first round's k
    max_k: int  # beyond this k, remaining queries are answered exactly
    leaves_factor: float = 1.0  # leaves searched: leaves_factor x the top-10 setting (more for large k)
    reorder_factor: float = 1.0  # candidates re-scored exactly: reorder_factor x k
    growth: int = GROWTH
    # score every member of the k-means leaves (the exact search's partitions) that hold a hit the ANN found;
    # False in manifests written before it existed, whose measured set recall is without it
    expand_leaves: bool = False

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> ThresholdParams:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


# Cost model (module docstring), in units of one (query, item) product of the batched exact scan
# (``partitions.scan_hits``): benchmarks/serving/threshold_cost_model.py, record threshold_cost_model.md.
BUDGET = 0.5  # of an exact search: the rounds a query may spend before it is answered exactly
# measured at 1M, alone on 2 cores (threshold_cost_model.md: a least-squares fit over 16 ScaNN settings, batches
# of 200 and of 1; the fixed part per ScaNN call it leaves is 0 there). The scan's cut at tau (``partitions.cut_at``)
# made the unit 2.9x smaller than the loaded first measurement's, so every step costs more scan products than then.
SCAN_READ = 11.0  # reading one gallery item, once per batch: a one-query scan costs (1 + SCAN_READ) per item
QUANTISED_ITEM = 1.0  # an item of a searched ScaNN leaf: 64 4-bit table look-ups (d = 128, 2 dims a block)
RESCORED_ITEM = 85.0  # a candidate ScaNN re-scores exactly and returns (gathered product, top-k, the result arrays)
EXPANDED_ITEM = 40.0  # a member of an expanded or probed partition leaf (gathered, scored without BLAS)
SPREAD_PRIOR = 10.0  # found hits added to the statistics' denominator: a query with few hits is not called unlike
FAMILIAR_QUANTILE = 0.995  # tuning queries' quantile of each statistic past which a query counts as unlike them
PROBE_LEAVES = 4  # leaves of highest mean score holding no found hit, scored for every approximate answer
# The near-miss band, in the index's score (cosine of unit vectors): a few times the 4-bit quantisation's score
# error. It only defines the statistic; the limit is the tuning queries' FAMILIAR_QUANTILE of it, in the manifest
# with the band it was measured with.
NEAR_BAND = 0.05


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Per-query costs of the approximate search's steps and of an exact search for a batch of ``batch`` queries
    (module docstring). ``base_leaves`` is the top-10 setting's ScaNN leaves."""

    n: int
    num_leaves: int
    base_leaves: int
    batch: int = 1

    @property
    def exact(self) -> float:
        return self.n * (1.0 + SCAN_READ / max(1, self.batch))

    def round(self, k: int, p: ThresholdParams) -> float:
        leaves = scann_leaves(self.base_leaves, self.num_leaves, self.n, k, p)
        searched = leaves * self.n / self.num_leaves
        return QUANTISED_ITEM * searched + RESCORED_ITEM * math.ceil(p.reorder_factor * k)

    def expansion(self, items: np.ndarray) -> np.ndarray:
        return EXPANDED_ITEM * np.asarray(items, dtype=np.float64)


@dataclasses.dataclass(frozen=True)
class ThresholdAnswer:
    """How one query's threshold answer was made: ``exact``, or approximate with ``set_recall`` (the figure the
    build measured for approximate answers; None where no figure applies), and why (``reason``)."""

    exact: bool
    set_recall: float | None
    reason: str

    def to_json(self) -> dict:
        return {"exact": self.exact, "set_recall": self.set_recall, "reason": self.reason}

    @classmethod
    def from_json(cls, d: dict | None) -> ThresholdAnswer:
        """An answer from JSON; a peer that sends none (older shard servers) made an answer of unknown recall."""
        if not isinstance(d, dict) or not isinstance(d.get("exact"), bool):
            return cls(exact=False, set_recall=None, reason=UNKNOWN)
        recall = d.get("set_recall")
        recall = float(recall) if isinstance(recall, (int, float)) and not isinstance(recall, bool) else None
        return cls(exact=d["exact"], set_recall=recall, reason=str(d.get("reason", UNKNOWN)))


# ThresholdAnswer.reason
ASKED = "exact search asked for"
INDEX_EXACT = "exact: the index has no measured approximate search"
COST = "exact: growing top-k would cost more than a scan"
UNFAMILIAR = "exact: the hits found spread over more leaves than the tuning queries' (a query unlike them)"
UNFAMILIAR_MISSED = (
    "exact: the probe leaves held more hits the rounds missed than the tuning queries' did (a query unlike them)"
)
UNFAMILIAR_NEAR = (
    "exact: the scored leaves held more items just below tau per hit than the tuning queries' did (hits at the top "
    "of a dense band of near-misses, which the quantised scores cannot order: a query unlike them)"
)
APPROXIMATE = "approximate"
UNCHECKED = (
    "approximate, unchecked: the index has no threshold partitions, so a query unlike the tuning queries is not "
    "detected and its set recall can be far below the figure"
)
UNKNOWN = "unknown (a shard that does not report how it answered)"
MERGED = "merged from shards' answers"


def merge_answers(answers: list[ThresholdAnswer]) -> ThresholdAnswer:
    """One query's answer over disjoint shards: exact when every shard's is; otherwise approximate with the lowest
    shard figure (the union's set recall is the hit-weighted mean of the shards', never below their lowest)."""
    if len(answers) == 1:
        return answers[0]
    if all(a.exact for a in answers):
        return ThresholdAnswer(True, 1.0, answers[0].reason if len({a.reason for a in answers}) == 1 else MERGED)
    approx = [a for a in answers if not a.exact]
    recalls = [a.set_recall for a in approx]
    reasons = {a.reason for a in approx}
    return ThresholdAnswer(
        False, None if None in recalls else min(recalls), reasons.pop() if len(reasons) == 1 else MERGED
    )


def spread(found: list[np.ndarray], have: list[np.ndarray]) -> np.ndarray:
    """Per query, the leaves ``have`` holding the ``found`` hits / (found + SPREAD_PRIOR). Known as soon as the
    rounds end: a query past its limit is answered exactly without the leaf scoring and the probe."""
    return np.array([len(v) for v in have], dtype=np.float64) / _found_prior(found)


def missed(
    partitions: BallPartitions, found: list[np.ndarray], probe: list[np.ndarray], rows: list[np.ndarray]
) -> np.ndarray:
    """Per query, the hits among the final ``rows`` that lie in the ``probe`` leaves (which held no found hit) /
    (found + SPREAD_PRIOR)."""
    counts = [np.isin(leaf_of_rows(partitions, r), v).sum() for r, v in zip(rows, probe, strict=True)]
    return np.array(counts, dtype=np.float64) / _found_prior(found)


def near_misses(near: np.ndarray, hits: np.ndarray) -> np.ndarray:
    """Per query, the scored leaves' items in ``[tau - NEAR_BAND, tau)`` (``near``) / (their hits + SPREAD_PRIOR)."""
    return np.asarray(near, np.float64) / (np.asarray(hits, np.float64) + SPREAD_PRIOR)


def _found_prior(found: list[np.ndarray]) -> np.ndarray:
    """The familiarity statistics' denominator: each query's found hits + SPREAD_PRIOR."""
    return np.array([len(f) for f in found], dtype=np.float64) + SPREAD_PRIOR


def probe_leaves(
    partitions: BallPartitions, queries: np.ndarray, have: list[np.ndarray], count: int = PROBE_LEAVES
) -> list[np.ndarray]:
    """Per query, the ``count`` partition leaves of highest mean score ``q.mu_l`` among those not in ``have[q]``
    (ascending): where hits the rounds missed would most likely be."""
    if count <= 0:
        return [np.zeros(0, np.int64) for _ in have]
    qc = queries @ partitions.centers.T
    qc[
        np.repeat(np.arange(len(have)), [len(h) for h in have]), np.concatenate([np.zeros(0, np.int64), *have])
    ] = -np.inf
    everyone, top = np.arange(len(qc)), []
    for _ in range(min(count, qc.shape[1])):  # count argmax passes: 6x faster than an argpartition at 7,812 leaves
        best = np.argmax(qc, axis=1)
        top.append(np.where(np.isfinite(qc[everyone, best]), best, -1))
        qc[everyone, best] = -np.inf
    top = np.stack(top, axis=1)
    return [np.sort(t[t >= 0]) for t in top]


def hit_leaves(partitions: BallPartitions, found: list[np.ndarray]) -> list[np.ndarray]:
    """The partition leaves (ascending) holding each query's found rows."""
    return [np.unique(leaf_of_rows(partitions, np.asarray(r, np.int64))) for r in found]


TopK = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]
Exact = Callable[[np.ndarray, float], tuple[list[np.ndarray], list[np.ndarray]]]


def grow_topk_threshold(
    queries: np.ndarray,
    tau: float,
    topk: TopK,
    exact: Exact,
    p: ThresholdParams,
    limit: int | None = None,
    costs: CostModel | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray], dict]:
    """Per query, rows and scores (descending) of the items with score >= ``tau`` found by growing top-k.

    ``topk(q, k) -> (rows [B, k'], scores [B, k'])``: exact re-scored scores, descending, padding non-finite.
    ``exact(q, tau) -> (rows, scores)`` lists: used for queries still above tau at ``p.max_k`` or, with ``costs``,
    before a round that would take a query's spent cost past ``BUDGET x costs.exact``.
    Returns ``(rows, scores, stats)`` with ``stats = {"rounds", "exact_queries", "max_k", "exact" (bool [B]: answered
    by ``exact``), "spent" (float [B]: each query's round costs, 0 without ``costs``)}``.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    b = len(queries)
    rows: list[np.ndarray] = [np.zeros(0, np.int64)] * b
    scores: list[np.ndarray] = [np.zeros(0, np.float32)] * b
    spent = np.zeros(b)
    todo = np.arange(b)
    k, rounds, k_used = max(1, int(p.start_k)), 0, 0
    while len(todo):
        k = min(k, p.max_k)
        cost = 0.0 if costs is None else costs.round(k, p)
        if costs is not None and spent[todo[0]] + cost > BUDGET * costs.exact:  # all left have spent the same
            break  # growing further may cost more than scanning: the rest are answered exactly
        spent[todo] += cost
        got_rows, got_scores = topk(queries[todo], k)
        rounds, k_used = rounds + 1, k
        above = np.isfinite(got_scores) & (got_scores >= tau)
        count = above.sum(axis=1)
        # the k-th score clears tau: items beyond the k-th may too (strict stop keeps ties at tau together)
        more = count >= got_scores.shape[1]
        if limit is not None:
            more &= count <= limit  # more than `limit` hits already: the best of them are the answer
        for j in np.flatnonzero(~more):
            rows[todo[j]] = got_rows[j, : count[j]].astype(np.int64)
            scores[todo[j]] = got_scores[j, : count[j]].astype(np.float32)
        todo = todo[more]
        if k >= p.max_k:
            break
        k *= p.growth
    answered_exactly = np.zeros(b, dtype=bool)
    if len(todo):  # still above tau at max_k, or past the cost model's budget: a scan is cheaper than more rounds
        ex_rows, ex_scores = exact(queries[todo], tau)
        for j, i in enumerate(todo):
            rows[i], scores[i] = ex_rows[j], ex_scores[j]
        answered_exactly[todo] = True
    stats = {"rounds": rounds, "exact_queries": int(len(todo)), "max_k": k_used}
    return rows, scores, stats | {"exact": answered_exactly, "spent": spent}


def expand_to_leaves(
    queries: np.ndarray, tau: float, found: list[np.ndarray], gallery: np.ndarray, partitions: BallPartitions
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every item with ``q.x >= tau`` in the leaves that hold a row of ``found[q]`` (``score_leaves``)."""
    return score_leaves(queries, tau, hit_leaves(partitions, found), gallery, partitions)


def score_leaves(
    queries: np.ndarray, tau: float, leaves: list[np.ndarray], gallery: np.ndarray, partitions: BallPartitions
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every item with ``q.x >= tau`` in the partition leaves ``leaves[q]`` (exactly scored; descending):
    :func:`score_leaves_near` without the near-miss counts."""
    rows, scores, _ = score_leaves_near(queries, tau, leaves, gallery, partitions)
    return rows, scores


def score_leaves_near(
    queries: np.ndarray,
    tau: float,
    leaves: list[np.ndarray],
    gallery: np.ndarray,
    partitions: BallPartitions,
    band: float = NEAR_BAND,
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Every item with ``q.x >= tau`` in the partition leaves ``leaves[q]`` (exactly scored; descending), and per
    query the count of the leaves' items scoring in ``[tau - band, tau)`` (the near-misses, :func:`near_misses`).

    A query's hits are few leaves' worth of items (those near it), but the ANN ranks leaves by their centres and
    misses the hits of leaves it ranks low; one hit it did find brings in its leaf and every hit there
    (``benchmarks/results/threshold_leaves.md``: on the hard gallery at 1M, 99 % of a query's hits lie in a median
    8 of 7,812 leaves, and ScaNN's hits with the top-10 leaves expand from set recall 0.86 to 0.98 by scoring about
    1,100 items per query).

    Each query's rows are gathered and scored with NumPy's own loops, without BLAS: BLAS on such small products
    runs its thread pool for microseconds of work, and under concurrent requests the pools of every request thread
    contend (measured through 8 threads at 100k: 90 queries/s with BLAS, against ~2,600 for one thread); and for a
    batch, one small BLAS product per leaf with the queries holding it (``partitions.exact_threshold_search`` with
    ``leaves``) measured 0.49 ms per query against 0.17 for this, 200 queries at 1M (load 4)."""
    out_rows, out_scores, near = [], [], np.zeros(len(leaves), np.int64)
    for j, (q, mine) in enumerate(zip(queries, leaves, strict=True)):
        rows = union_rows(partitions, np.asarray(mine, np.int64))
        scores = np.einsum("ij,j->i", gallery[rows], q)  # no BLAS (docstring)
        keep = scores >= tau
        near[j] = np.count_nonzero(scores >= tau - band) - np.count_nonzero(keep)
        rows, scores = rows[keep], scores[keep]
        order = np.lexsort((rows, -scores))
        out_rows.append(rows[order])
        out_scores.append(scores[order].astype(np.float32))
    return out_rows, out_scores, near


def set_recall(found: list[np.ndarray], truth: list[np.ndarray]) -> float | None:
    """``sum_q |found_q & truth_q| / sum_q |truth_q|`` (None when no query has a true hit)."""
    total = sum(len(t) for t in truth)
    if total == 0:
        return None
    hit = sum(len(np.intersect1d(f, t, assume_unique=True)) for f, t in zip(found, truth, strict=True))
    return float(hit / total)


# The tuning accepts a point when the lower bound of its set recall reaches the target (one-sided, this confidence):
# the tuning queries are a sample of the traffic, and a point estimate at the target is short of it half the time.
SET_RECALL_CONFIDENCE = 0.95


def set_recall_lower_bound(
    found: list[np.ndarray], truth: list[np.ndarray], confidence: float = SET_RECALL_CONFIDENCE
) -> float | None:
    """Lower ``confidence`` bound of the set recall over the population the queries were drawn from. A query's
    hits are found or missed together (a leaf the search skipped holds several), so queries are the clusters:
    Clopper-Pearson at the effective number of hits ``sum_q |E_q| / deff`` (``utils.proportions``). None when no
    query has a true hit."""
    n_unit = np.array([len(t) for t in truth], np.float64)
    x_unit = np.array(
        [len(np.intersect1d(f, t, assume_unique=True)) for f, t in zip(found, truth, strict=True)], np.float64
    )
    return clustered_lower_bound(x_unit, n_unit, confidence)


def exact_sets(queries: np.ndarray, x: np.ndarray, taus: list[float], block: int = 1 << 16) -> list[list[np.ndarray]]:
    """Reference answers by a blocked scan: ``sets[t][q]`` = rows of ``x`` with ``q.x >= taus[t]`` (ascending)."""
    lo = min(taus)
    per_query: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(len(queries))]
    for s in range(0, len(x), block):
        sc = queries @ x[s : s + block].T
        qi, ri = np.nonzero(sc >= lo)
        vals = sc[qi, ri]
        bounds = np.searchsorted(qi, np.arange(len(queries) + 1))
        for i in range(len(queries)):
            per_query[i].append((ri[bounds[i] : bounds[i + 1]] + s, vals[bounds[i] : bounds[i + 1]]))
    out = []
    for tau in taus:
        sets = []
        for parts in per_query:
            r = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
            v = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.float32)
            sets.append(np.sort(r[v >= tau]).astype(np.int64))
        out.append(sets)
    return out


def tau_for_median_hits(queries: np.ndarray, x: np.ndarray, hits: int = 100) -> float:
    """A threshold at which the median query has about ``hits`` hits: the median of the queries' ``hits``-th score."""
    _, s = exact_search(queries, x, min(hits, len(x)))
    return float(np.median(s[:, -1]))


def tune_threshold_params(
    search: Callable[[np.ndarray, float, ThresholdParams], list[np.ndarray]],
    queries: np.ndarray,
    taus: dict[str, float],
    truth: dict[str, list[np.ndarray]],
    base: ThresholdParams,
    target: float,
    max_leaves_factor: float = LEAVES_FACTORS[-1],
    expansion_items: Callable[[list[np.ndarray]], float] | None = None,
    confidence: float | None = SET_RECALL_CONFIDENCE,
) -> tuple[ThresholdParams, dict, list[dict]]:
    """The first ``(leaves_factor, reorder_factor, expand_leaves)`` whose set recall reaches ``target`` at every
    threshold in ``taus`` (its lower ``confidence`` bound over the queries, :func:`set_recall_lower_bound`; the
    point estimate with ``confidence=None``), walking leaves factors up and re-scoring depths up at each (module
    comment at ``LEAVES_FACTORS``); at each point without the leaf expansion first (it costs exact scores), then
    with it when ``base.expand_leaves``.

    When the first point to reach the target needs the expansion and ``expansion_items(found rows per query)``
    (the exact scores the expansion made per query) is given, deeper re-scoring without the expansion at the same
    leaves is tried too, and the point with fewer exact scores per query wins: ``reorder_factor x start_k`` (+ the
    expansion's items). Both search the same leaves, so their quantised scoring costs the same; what differs is
    exact scores (re-scored candidates against expanded leaves' members). On queries whose hits are spread thinly
    (measured: captions against the hard gallery at 100k) the expansion scores thousands of items where 2x deeper
    re-scoring reaches the target for 1,600 more.

    ``search(queries, tau, params) -> found rows per query``; ``max_leaves_factor`` is the factor that searches
    every leaf (the last one tried). Returns ``(params, its row, tuning table)``: a row holds ``set_recall`` and
    ``set_recall_lower`` per threshold name; when no point reaches the target, the best one (by its lowest
    bound). One bound per point, each at ``confidence``: the walk stops at the first point whose bound clears the
    target, so a point short of it is accepted with probability at most 1 - confidence only when it is the first
    to clear (points well short of the target almost never do)."""
    table: list[dict] = []
    tried: list[ThresholdParams] = []

    def measure(p: ThresholdParams) -> tuple[dict, dict]:
        """Runs ``p`` at every threshold, appends its row to the tuning table; returns (row, found rows)."""
        found = {name: search(queries, tau, p) for name, tau in taus.items()}
        recalls = {name: set_recall(found[name], truth[name]) for name in taus}
        lower = (
            recalls
            if confidence is None
            else {name: set_recall_lower_bound(found[name], truth[name], confidence) for name in taus}
        )
        row = {
            "leaves_factor": p.leaves_factor,
            "reorder_factor": p.reorder_factor,
            "expand_leaves": p.expand_leaves,
            "set_recall": recalls,
            "set_recall_lower": lower,
        }
        table.append(row)
        tried.append(p)
        return row, found

    factors = sorted({f for f in LEAVES_FACTORS if f < max_leaves_factor} | {float(max_leaves_factor)})
    expansions = (False, True) if base.expand_leaves else (False,)
    start = 0
    for leaves_factor in factors:
        previous = None
        for j in range(start, len(REORDER_FACTORS)):
            best_here = 0.0
            for expand in expansions:
                p = dataclasses.replace(
                    base,
                    leaves_factor=float(leaves_factor),
                    reorder_factor=float(REORDER_FACTORS[j]),
                    expand_leaves=expand,
                )
                row, found = measure(p)
                if _worst(row) >= target:
                    if expand and expansion_items is not None:
                        items = max(expansion_items(f) for f in found.values())
                        row["exact_scores_per_query"] = p.reorder_factor * p.start_k + items
                        p, row = _cheaper_without_expansion(measure, p, row, j, target)
                    return p, row, table
                best_here = max(best_here, _worst(row))
            if previous is not None and best_here - previous < REORDER_SATURATION:
                start = j - 1  # deeper re-scoring stopped paying: more leaves, from the depth that saturated
                break
            previous = best_here
    best = max(range(len(table)), key=lambda i: _worst(table[i]))
    return tried[best], table[best], table


def _cheaper_without_expansion(measure, p: ThresholdParams, row: dict, j: int, target: float):
    """Deeper re-scoring than ``REORDER_FACTORS[j]`` without the expansion at ``p``'s leaves, while it makes fewer
    exact scores per query than ``p`` (``row["exact_scores_per_query"]``): the first depth reaching ``target``, as
    ``(params, row)``, else ``(p, row)``."""
    for reorder_factor in REORDER_FACTORS[j + 1 :]:
        if reorder_factor * p.start_k >= row["exact_scores_per_query"]:
            break
        q = dataclasses.replace(p, reorder_factor=float(reorder_factor), expand_leaves=False)
        deeper, _ = measure(q)
        deeper["exact_scores_per_query"] = reorder_factor * p.start_k
        if _worst(deeper) >= target:
            return q, deeper
    return p, row


def _worst(row: dict) -> float:
    """The row's lowest set recall bound over the thresholds (1 where no threshold has a true hit)."""
    measured = [r for r in row["set_recall_lower"].values() if r is not None]
    return min(measured) if measured else 1.0


def default_threshold_params(n: int, reorder: int) -> ThresholdParams:
    """``start_k`` = the re-ranking depth (free in the first round), ``max_k`` = n / 10 (then a scan is cheaper)."""
    max_k = max(1, n // 10)
    return ThresholdParams(start_k=max(1, min(int(reorder), max_k)), max_k=max_k, expand_leaves=True)


def scann_leaves(base_leaves: int, num_leaves: int, n: int, k: int, p: ThresholdParams) -> int:
    """Leaves to search at top-k ``k``: the tuned top-10 setting times ``leaves_factor``, and enough leaves to hold
    twice the re-scored candidates; never more than all of them."""
    pre = math.ceil(p.reorder_factor * k)
    return int(min(num_leaves, max(math.ceil(p.leaves_factor * base_leaves), math.ceil(2 * pre * num_leaves / n))))
