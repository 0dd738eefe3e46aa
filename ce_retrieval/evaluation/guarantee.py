"""Thresholds with a guarantee: "precision >= p on new queries against the served gallery", with confidence 1 - delta.

Why not the validation curve's threshold. ``threshold_for_precision`` ships the lowest threshold whose
validation precision reaches p: the largest-recall point that happens to cross the line on one sample, which
is optimistic by construction (winner's curse), and it speaks about a gallery of the validation split's size.

Rates that do not depend on the gallery's size. For a threshold t, over caption x image pairs,

    TPR(t) = P(s >= t | relevant),      FPR(t) = P(s >= t | irrelevant).

A served gallery of M items where a query has r relevant items on average (r measured on validation, or given)
returns r TPR relevant and (M - r) FPR irrelevant items per query, so the precision of "s >= t" there is

    prec_M(t) = r TPR(t) / (r TPR(t) + (M - r) FPR(t)).                                    (1)

At the validation gallery's own size (1) is exactly the global PR curve's precision TP / (TP + FP), so the
point estimate is today's calibrated threshold; for a larger gallery the same rates give a lower precision.

Confidence bounds that respect how the data were sampled. Validation pairs are not independent: every
caption's pairs share the caption, every image's pairs share the image, and the captions of one image share it
too. Each rate is a proportion X / n over such clustered pairs. Its variance is estimated with two-way cluster
sums (Cameron, Gelbach & Miller 2011) over query units (the captions of one image id) and gallery images,

    V = K_u/(K_u-1) sum_u (x_u - p n_u)^2 / n^2  +  K_v/(K_v-1) sum_v (x_v - p n_v)^2 / n^2  -  p (1 - p) / n,

the last term the pairs' own (binomial) variance, which both cluster sums contain: without it an independent
sample would get a design effect of 2 (the form of the library before 2026-11-29, which certified accordingly
less). (For relevant pairs the two clusterings coincide, so only the query units are used; with relevance given
as pairs, where an image's relevant pairs may span several query units, both are combined for them too.) This gives
the design effect
``deff = V / (p (1 - p) / n)`` (at least 1) and the effective sample size ``n / deff``. The test below then runs
on effective counts (k / deff, n / deff and likewise for the irrelevant pairs; Korn & Graubard 1998): exact for
independent pairs, widened by the clustering otherwise. Where a rate has fewer than ``MIN_EVENTS`` events
the variance estimate is unreliable, and the design effect of the nearest grid point with enough events is used.

The served gallery is a finite draw of images too. Its own image effects move its rates away from the
population's: a promise about "the gallery being served" must cover that. The part of each rate's cluster variance
that comes from images beyond the pairs' own binomial variance (deff - 1 for the relevant pairs, which cluster on
their image; ``deff_fp_gallery`` for the irrelevant ones) is added once more, scaled by M_val / M: a served
gallery of the validation's size doubles it, a gallery 100 times larger adds 1 %. Independent pairs add nothing.

One test per candidate and level, on the ratio of the two rates. By (1), prec_M(t) >= p exactly when

    FPR(t) / TPR(t) <= c_p = r (1 - p) / ((M - r) p).                                          (2)

The candidate thresholds are G order statistics of the validation positives' scores (TPR levels 1/G, 2/G, ...,
1). At the k-th highest of n positive scores the true TPR u is Beta(k, n - k + 1) distributed, and the
irrelevant pairs above it, FP, are Binomial(n_neg, FPR) given u, independent of the positives. For a fixed
ratio c, whatever the ROC curve FPR = g(TPR), the event "g(u) > c u and FP <= f" has probability at most

    pv(c; k, f) = E_{u ~ Beta(k, n - k + 1)} P(Binomial(n_neg, c u) <= f),                     (3)

since Binomial(n_neg, g(u)) is stochastically larger than Binomial(n_neg, c u) where g(u) > c u. So (3) at the
observed f is a valid p-value for "the precision at this candidate is below p": it accounts for both rates'
uncertainty at once, where bounding TPR and FPR separately (the library's form before 2026-11-29) spends the
error twice and adds the two bounds' widths. (3) is computed as an upper Riemann sum (the binomial tail falls as
u grows; exact Beta masses on log-spaced steps), so the computed value is never below the true one.

Simultaneous over thresholds and levels (Learn then Test, Angelopoulos et al. 2021, Bonferroni form): each of
the G x L tests (G candidates, L offered levels) is taken at alpha = delta / (G L), so with probability
>= 1 - delta no candidate is certified for a level it does not reach. The guaranteed threshold for p is the
lowest certified candidate (largest recall); none is a refusal ("the validation data cannot certify p"), never a
silent fallback. The promise covers the offered levels; ``precision_lower_bound`` reports, for information, the
highest precision the chosen candidate's test would pass at the same alpha.

Assumptions (docs/evaluation.md): validation queries and images are drawn like the served ones (the guarantee
is about the population they come from, not about a different domain: recalibrate there with a few labels),
extra served items are irrelevant to a query at the validation FPR, and r is right for the served gallery.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import special, stats

from ce_retrieval.evaluation._arrays import block_rows, check_pair, check_positives, required_positive_pairs
from ce_retrieval.evaluation.calibration import DEFAULT_BLOCK_ELEMENTS
from ce_retrieval.utils.proportions import clopper_pearson, cluster_variance, two_way

__all__ = [
    "DEFAULT_DELTA",
    "DEFAULT_GRID",
    "METHOD",
    "ScoreRates",
    "guaranteed_thresholds",
    "measure_rates",
    "rates_from_scores",
    "precision_at_size",
    "ratio_pvalues",
]

DEFAULT_DELTA = 0.1
DEFAULT_GRID = 64
MIN_EVENTS = 10
METHOD = "ltt-bonferroni/beta-binomial-ratio-two-way"
QUADRATURE_NODES = 256
TAIL = 1e-13  # Beta mass left out at each end of the quadrature (added to the p-value in full)
FORMAT = "rates/1"


@dataclasses.dataclass
class ScoreRates:
    """Counts of relevant / irrelevant pairs at or above each candidate threshold on a calibration split, with
    their design effects; what a gallery of any size needs to get its thresholds (eq. 1, 2)."""

    thresholds: np.ndarray  # float32 [G], descending: order statistics of the positives' scores
    tp: np.ndarray  # int64 [G]: relevant pairs with s >= t
    fp: np.ndarray  # int64 [G]: irrelevant pairs with s >= t
    deff_tp: np.ndarray  # float64 [G] >= 1
    deff_fp: np.ndarray  # float64 [G] >= 1
    num_positives: int
    num_negatives: int
    num_queries: int
    num_documents: int
    # the full curve for the point estimate: every distinct positive score (descending) and its counts
    curve_thresholds: np.ndarray
    curve_tp: np.ndarray
    curve_fp: np.ndarray
    # the part of the irrelevant rate's design effect that comes from the gallery's images beyond the pairs' own
    # binomial variance (V_images - p (1 - p) / n, over p (1 - p) / n; >= 0): what a served gallery, itself a
    # finite draw of images, adds (guaranteed_thresholds). None in calibrations made before it was stored.
    deff_fp_gallery: np.ndarray | None = None

    @property
    def relevant_per_query(self) -> float:
        return self.num_positives / self.num_queries

    def to_json(self) -> dict:
        f = lambda a, d=7: [round(float(v), d) for v in a]  # noqa: E731
        return {
            "format": FORMAT,
            "thresholds": f(self.thresholds, 9),
            "tp": [int(v) for v in self.tp],
            "fp": [int(v) for v in self.fp],
            "deff_tp": [float(v) for v in self.deff_tp],
            "deff_fp": [float(v) for v in self.deff_fp],
            "num_positives": int(self.num_positives),
            "num_negatives": int(self.num_negatives),
            "num_queries": int(self.num_queries),
            "num_documents": int(self.num_documents),
            "curve_thresholds": f(self.curve_thresholds, 9),
            "curve_tp": [int(v) for v in self.curve_tp],
            "curve_fp": [int(v) for v in self.curve_fp],
            **({} if self.deff_fp_gallery is None else {"deff_fp_gallery": [float(v) for v in self.deff_fp_gallery]}),
        }

    @classmethod
    def from_json(cls, d: dict) -> ScoreRates:
        if d.get("format") != FORMAT:
            raise ValueError(f"unknown rates format {d.get('format')!r}, expected {FORMAT!r}")
        arr = lambda k, t: np.asarray(d[k], t)  # noqa: E731
        return cls(
            arr("thresholds", np.float32),
            arr("tp", np.int64),
            arr("fp", np.int64),
            arr("deff_tp", np.float64),
            arr("deff_fp", np.float64),
            int(d["num_positives"]),
            int(d["num_negatives"]),
            int(d["num_queries"]),
            int(d["num_documents"]),
            arr("curve_thresholds", np.float32),
            arr("curve_tp", np.int64),
            arr("curve_fp", np.int64),
            arr("deff_fp_gallery", np.float64) if "deff_fp_gallery" in d else None,
        )


def _grid(pos_scores: np.ndarray, size: int) -> np.ndarray:
    """Descending candidate thresholds: the ceil(P g / G)-th highest positive score for g = 1..G (distinct)."""
    desc = np.sort(pos_scores)[::-1]
    ranks = np.unique(np.ceil(len(desc) * np.arange(1, size + 1) / size).astype(np.int64))
    return np.unique(desc[np.clip(ranks, 1, len(desc)) - 1])[::-1]


def _design_effect(var: np.ndarray, x: np.ndarray, n: int, floor: float = 1.0, excess: bool = False) -> np.ndarray:
    """``V / (p (1 - p) / n)`` at least ``floor`` (``excess``: ``V / (p (1 - p) / n) - 1``, the part beyond the
    binomial variance); points with fewer than MIN_EVENTS events (or none left) take the value of the nearest
    point that has enough (the largest over all points when none has)."""
    p = x / max(n, 1)
    binom = p * (1 - p) / max(n, 1)
    deff = np.where(binom > 0, var / np.where(binom > 0, binom, 1.0), 1.0)
    deff = np.maximum(deff - float(excess), floor)
    ok = (x >= MIN_EVENTS) & (n - x >= MIN_EVENTS)
    if not ok.any():
        return np.full_like(deff, float(deff.max()) if len(deff) else 1.0)
    good = np.flatnonzero(ok)
    nearest = good[np.argmin(np.abs(np.arange(len(deff))[:, None] - good[None, :]), axis=1)]
    return np.where(ok, deff, deff[nearest])


def _ge_counts(hist: np.ndarray) -> np.ndarray:
    """``#{s >= a[j]}`` from histograms of ``searchsorted(a, s, 'right')`` over the last axis (length G + 1)."""
    return np.cumsum(hist[..., ::-1], axis=-1)[..., ::-1][..., 1:]


def measure_rates(
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    grid_size: int = DEFAULT_GRID,
    block_size: int | None = None,
    positives=None,
) -> ScoreRates:
    """Counts and design effects of both rates at ``grid_size`` candidate thresholds, over every query x
    document pair of a calibration split (positive iff the ids are equal), streamed in row blocks.

    Query units are the distinct query ids (the captions of one image), gallery units the documents.
    Scores are the float32 products of row blocks ``Q[r0:r1] D^T``, as ``global_pr_auc`` makes them.
    ``positives``: the relevant pairs ``(rows, cols)`` instead of id equality (queries relevant to several
    documents); ``query_ids`` then only name the query units, which must hold every positive pair of a document.
    """
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    dt = np.ascontiguousarray(d.T)
    rows = block_rows(block_size, len(d), DEFAULT_BLOCK_ELEMENTS)
    return _rates(lambda r0, r1: q[r0:r1] @ dt, len(q), len(d), qids, dids, grid_size, rows, positives)


def rates_from_scores(scores, query_ids, doc_ids, grid_size: int = DEFAULT_GRID) -> ScoreRates:
    """:func:`measure_rates` on a given ``[N, M]`` score matrix (simulations, other scorers)."""
    s = np.asarray(scores, np.float32)
    if s.ndim != 2 or not np.all(np.isfinite(s)):
        raise ValueError(f"scores must be a finite [num_queries, num_documents] matrix, got shape {s.shape}")
    qids, dids = np.asarray(query_ids).reshape(-1), np.asarray(doc_ids).reshape(-1)
    if (len(qids), len(dids)) != s.shape:
        raise ValueError(f"ids ({len(qids)}, {len(dids)}) do not match the scores' shape {s.shape}")
    return _rates(lambda r0, r1: s[r0:r1], s.shape[0], s.shape[1], qids, dids, grid_size, s.shape[0])


def _rates(block, n: int, m: int, qids, dids, grid_size: int, rows: int, positives=None) -> ScoreRates:
    """Two passes over the score blocks ``block(r0, r1)``: the positives' scores (the candidates), then every
    score's position among the candidates, per query row and per document."""
    if int(grid_size) < 1:
        raise ValueError(f"grid_size must be at least 1, got {grid_size}")
    if positives is None:
        pos_rows, pos_cols = required_positive_pairs(qids, dids, "measure_rates")
    else:
        pos_rows, pos_cols = check_positives(positives, n, m, "measure_rates")
    starts = np.searchsorted(pos_rows, np.arange(0, n + rows, rows))
    blocks = [(r0, min(n, r0 + rows), starts[b], starts[b + 1]) for b, r0 in enumerate(range(0, n, rows))]

    pos_scores = np.empty(len(pos_rows), np.float32)  # pass 1: the positives' scores, as pass 2's blocks give them
    for r0, r1, a, z in blocks:
        if z > a:
            pos_scores[a:z] = block(r0, r1)[pos_rows[a:z] - r0, pos_cols[a:z]]
    grid = _grid(pos_scores, int(grid_size))
    asc = grid[::-1].copy()
    g = len(asc)
    curve_asc = np.unique(pos_scores)  # every distinct positive score: the point estimate's curve

    row_hist = np.zeros((n, g + 1), np.int64)  # pass 2: every score's grid position, per query row and document
    col_hist = np.zeros((m, g + 1), np.int64)
    curve_hist = np.zeros(len(curve_asc) + 1, np.int64)
    for r0, r1, a, z in blocks:
        s = block(r0, r1)
        if not np.array_equal(s[pos_rows[a:z] - r0, pos_cols[a:z]], pos_scores[a:z]):
            raise RuntimeError("the matrix product is not deterministic across passes; cannot count ties exactly")
        b = np.searchsorted(asc, s, side="right")  # [r, M] in 0..G
        row_hist[r0:r1] = np.bincount(
            (np.arange(r1 - r0)[:, None] * (g + 1) + b).reshape(-1), minlength=(r1 - r0) * (g + 1)
        ).reshape(r1 - r0, g + 1)
        col_hist += np.bincount((np.arange(m)[None, :] * (g + 1) + b).reshape(-1), minlength=m * (g + 1)).reshape(
            m, g + 1
        )
        curve_hist += np.bincount(np.searchsorted(curve_asc, s.reshape(-1), side="right"), minlength=len(curve_asc) + 1)
    pb = np.searchsorted(asc, pos_scores, side="right")
    pos_row_hist = np.zeros((n, g + 1), np.int64)
    np.add.at(pos_row_hist, (pos_rows, pb), 1)
    pos_col_hist = np.zeros((m, g + 1), np.int64)
    np.add.at(pos_col_hist, (pos_cols, pb), 1)
    neg_row = _ge_counts(row_hist - pos_row_hist)[:, ::-1]  # [N, G], columns in descending-threshold order
    neg_col = _ge_counts(col_hist - pos_col_hist)[:, ::-1]
    pos_row = _ge_counts(pos_row_hist)[:, ::-1]

    num_pos, num_neg = len(pos_rows), n * m - len(pos_rows)
    unit_of_row = np.unique(qids, return_inverse=True)[1].reshape(-1)
    units = unit_of_row.max() + 1
    pos_per_row = np.bincount(pos_rows, minlength=n)

    def by_unit(a):
        out = np.zeros((units, a.shape[1]) if a.ndim == 2 else units, np.float64)
        np.add.at(out, unit_of_row, a)
        return out

    tp, fp = pos_row.sum(0), neg_row.sum(0)
    var_tp = cluster_variance(by_unit(pos_row), by_unit(pos_per_row), num_pos)
    if positives is not None and _spans_units(unit_of_row[pos_rows], pos_cols):
        pos_col = _ge_counts(pos_col_hist)[:, ::-1]  # the documents' clustering of the relevant pairs too
        var_col = cluster_variance(pos_col.astype(np.float64), np.bincount(pos_cols, minlength=m), num_pos)
        var_tp = two_way(var_tp, var_col, tp, num_pos)
    neg_per_row = m - pos_per_row
    neg_per_col = n - np.bincount(pos_cols, minlength=m)
    var_fp_images = cluster_variance(neg_col.astype(np.float64), neg_per_col, num_neg)
    var_fp = two_way(cluster_variance(by_unit(neg_row), by_unit(neg_per_row), num_neg), var_fp_images, fp, num_neg)
    all_ge = _ge_counts(curve_hist)
    pos_ge = _ge_counts(np.bincount(np.searchsorted(curve_asc, pos_scores, side="right"), minlength=len(curve_asc) + 1))
    return ScoreRates(
        thresholds=grid,
        tp=tp.astype(np.int64),
        fp=fp.astype(np.int64),
        deff_tp=_design_effect(var_tp, tp, num_pos),
        deff_fp=_design_effect(var_fp, fp, num_neg),
        num_positives=num_pos,
        num_negatives=num_neg,
        num_queries=n,
        num_documents=m,
        curve_thresholds=curve_asc[::-1].copy(),
        curve_tp=pos_ge[::-1].copy(),
        curve_fp=(all_ge - pos_ge)[::-1].copy(),
        deff_fp_gallery=_design_effect(var_fp_images, fp, num_neg, floor=0.0, excess=True),
    )


def _spans_units(units: np.ndarray, cols: np.ndarray) -> bool:
    """Whether some document's relevant pairs fall in more than one query unit (the clusterings do not nest)."""
    pairs = np.unique(np.stack([cols, units]), axis=1)
    return len(np.unique(pairs[0])) < pairs.shape[1]


def precision_at_size(tpr, fpr, gallery_size: float, relevant_per_query: float) -> np.ndarray:
    """Eq. (1): the precision of "s >= t" for queries with ``r`` relevant items among ``M`` (NaN where nothing
    is returned)."""
    r, m = float(relevant_per_query), float(gallery_size)
    hits = r * np.asarray(tpr, np.float64)
    false = max(m - r, 0.0) * np.asarray(fpr, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(hits + false > 0, hits / (hits + false), np.nan)


def ratio_pvalues(k, n, f, n_neg, ratios) -> np.ndarray:
    """Eq. (3) for each candidate and ratio c: an upper bound, never below the true value, of

        E_{u ~ Beta(k, n - k + 1)} P(Binomial(n_neg, c u) <= f).

    ``k``, ``n`` (positives above the candidate, all positives) and ``f``, ``n_neg`` (the same for the irrelevant
    pairs) are [G] and may be real (effective counts); ``ratios`` is [L] (the same for every candidate) or [G, L].
    Returns [G, L]. The Beta is cut at its ``TAIL`` and ``1 - TAIL`` quantiles into ``QUADRATURE_NODES`` equal
    steps in log u (fine both where the Beta is wide and skewed, k small, and where it is narrow); each step's
    exact Beta mass is weighted by the binomial tail at the step's left end (the largest on the step, as the tail
    falls with u), and the mass below the cut counts in full.
    """
    k, n, f, nn = (np.atleast_1d(np.asarray(v, np.float64)) for v in (k, n, f, n_neg))
    c = np.asarray(ratios, np.float64)
    c = np.broadcast_to(c if c.ndim == 2 else np.atleast_1d(c)[None, :], (len(k), np.atleast_1d(c).shape[-1]))
    return _tail_sum(*_quadrature(k, n), f, nn, c)


def _quadrature(k: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each candidate's quadrature of Beta(k, n - k + 1) (see :func:`ratio_pvalues`): the pieces' left ends and
    their exact masses, [G, Q + 2] each (the first piece [0, TAIL quantile), the last up to 1)."""
    a, b = np.maximum(k, 1e-12), n - k + 1.0
    lo = np.maximum(special.betaincinv(a, b, TAIL), 1e-300)
    hi = special.betaincinv(a, b, 1.0 - TAIL)
    u = lo[:, None] * (hi / lo)[:, None] ** np.linspace(0.0, 1.0, QUADRATURE_NODES + 1)[None, :]  # [G, Q + 1]
    cdf = special.betainc(a[:, None], b[:, None], u)
    mass = np.concatenate([cdf[:, :1], np.diff(cdf, axis=1), 1.0 - cdf[:, -1:]], axis=1)
    left = np.concatenate([np.zeros_like(lo)[:, None], u], axis=1)
    return left, np.maximum(mass, 0.0)


def _tail_sum(left: np.ndarray, mass: np.ndarray, f: np.ndarray, nn: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Sum over the pieces of mass x P(Binomial(nn, c u_left) <= f), for ratios ``c`` [G, L]: [G, L]."""
    q = c[:, :, None] * left[:, None, :]  # [G, L, Q + 2]: the binomial's rate at each left end
    fb, nb = f[:, None, None], nn[:, None, None]
    with np.errstate(invalid="ignore"):
        tail = special.betainc(np.maximum(nb - fb, 1e-12), fb + 1.0, np.clip(1.0 - q, 0.0, 1.0))
    tail = np.where(fb >= nb, 1.0, np.where(q >= 1.0, 0.0, np.where(q <= 0.0, 1.0, tail)))
    return np.minimum(np.einsum("glq,gq->gl", tail, mass), 1.0)


def _ratio_bounds(quadrature, f, n_neg, alpha: float, guess, tol: float = 1e-5) -> np.ndarray:
    """For each candidate, the smallest ratio c whose test (3) passes at ``alpha`` (the p-value falls as c grows),
    to ``tol`` in log c: a bracket of width 2 around ``guess`` (log c), widened (doubling, within [-30, 30]) until
    it holds the crossing, then regula falsi with the Illinois step on log p-value - log alpha. Returns the
    brackets' upper ends (ratios that pass)."""
    left, mass = quadrature  # the candidates' Beta quadrature (_quadrature), [G, Q + 2] each
    f, n_neg = np.atleast_1d(np.asarray(f, np.float64)), np.atleast_1d(np.asarray(n_neg, np.float64))

    def h(x):  # > 0 where the test fails, <= 0 where it passes
        pv = _tail_sum(left, mass, f, n_neg, np.exp(x)[:, None])[:, 0]
        return np.log(np.maximum(pv, 1e-300)) - np.log(alpha)

    guess = np.clip(np.nan_to_num(np.asarray(guess, np.float64), nan=0.0, posinf=29.0, neginf=-29.0), -29.0, 29.0)
    lo, hi, width = guess - 1.0, guess + 1.0, 2.0
    h_lo, h_hi = h(lo), h(hi)
    for _ in range(8):  # widen until h(lo) > 0 >= h(hi), or the bracket meets [-30, 30]
        low_passes, high_fails = (h_lo <= 0) & (lo > -30.0), (h_hi > 0) & (hi < 30.0)
        if not (low_passes.any() or high_fails.any()):
            break
        hi, h_hi = np.where(low_passes, lo, hi), np.where(low_passes, h_lo, h_hi)
        lo = np.where(low_passes, np.maximum(lo - width, -30.0), lo)
        lo, h_lo = np.where(high_fails, hi, lo), np.where(high_fails, h_hi, h_lo)
        hi = np.where(high_fails, np.minimum(hi + width, 30.0), hi)
        h_lo, h_hi = np.where(low_passes, h(lo), h_lo), np.where(high_fails, h(hi), h_hi)
        width *= 2
    live = (h_lo > 0) & (h_hi <= 0)  # bracketed; the others keep their end (a clamp of [-30, 30])
    side = np.zeros(len(f))  # the side the last step moved: +1 upper end, -1 lower end
    for _ in range(60):
        if not np.any(live & (hi - lo > tol)):
            break
        x = np.where(live, hi - h_hi * (hi - lo) / np.where(h_hi - h_lo < 0, h_hi - h_lo, -1.0), hi)
        x = np.clip(x, lo + 0.01 * (hi - lo), hi - 0.01 * (hi - lo))
        hx = h(x)
        up = live & (hx <= 0)
        down = live & (hx > 0)
        h_lo = np.where(up & (side > 0), h_lo / 2, h_lo)  # Illinois: the end that stayed twice gets half weight
        h_hi = np.where(down & (side < 0), h_hi / 2, h_hi)
        hi, h_hi = np.where(up, x, hi), np.where(up, hx, h_hi)
        lo, h_lo = np.where(down, x, lo), np.where(down, hx, h_lo)
        side = np.where(up, 1.0, np.where(down, -1.0, side))
    return np.exp(hi)


def _level_key(p: float) -> str:
    return f"{float(p):g}"


def _estimate(rates: ScoreRates, p: float, gallery_size: float, r: float) -> dict | None:
    """The point estimate (today's threshold at the validation size): the lowest curve threshold whose eq. (1)
    precision from the observed rates reaches p."""
    tpr = rates.curve_tp / rates.num_positives
    fpr = rates.curve_fp / max(rates.num_negatives, 1)
    prec = precision_at_size(tpr, fpr, gallery_size, r)
    ok = np.flatnonzero(np.nan_to_num(prec, nan=0.0) >= p)
    if len(ok) == 0:
        return None
    k = ok[-1]
    return {"threshold": float(rates.curve_thresholds[k]), "precision": float(prec[k]), "recall": float(tpr[k])}


def guaranteed_thresholds(
    rates: ScoreRates,
    levels=(0.5, 0.8, 0.9),
    delta: float = DEFAULT_DELTA,
    gallery_size: int | None = None,
    relevant_per_query: float | None = None,
) -> dict:
    """Guaranteed and estimated thresholds for each precision level on a gallery of ``gallery_size`` items.

    ``gallery_size`` defaults to the calibration split's, ``relevant_per_query`` to the one measured there.
    Returns the manifest block: ``method``, ``delta``, ``gallery_size``, ``relevant_per_query`` (+ ``_source``),
    the calibration sizes, ``threshold_at_precision`` (guaranteed; None where refused), ``levels`` (per level:
    ``threshold``, ``precision_lower_bound``, ``recall_lower_bound``, ``recall_estimate`` or ``refused`` with
    the reason) and ``estimated`` (the point estimate's ``threshold_at_precision`` and per-level entries).
    """
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    m = rates.num_documents if gallery_size is None else int(gallery_size)
    if m < 1:
        raise ValueError(f"gallery_size must be at least 1, got {gallery_size}")
    r_source = "validation" if relevant_per_query is None else "given"
    r = rates.relevant_per_query if relevant_per_query is None else float(relevant_per_query)
    if not 0.0 < r <= m:
        raise ValueError(f"relevant_per_query must be in (0, gallery_size], got {r}")
    levels = sorted({float(v) for v in levels})
    for p in levels:
        if not 0.0 < p < 1.0:
            raise ValueError(f"precision levels must be in (0, 1), got {p}")
    g = len(rates.thresholds)
    alpha = float(delta) / (g * max(len(levels), 1))
    # the served gallery is a finite draw of images too: its own image effects add the between-image variance,
    # measured on validation, scaled by M_val / M (module docstring); calibrations stored without the gallery
    # part of the irrelevant rate's design effect take the whole design effect instead (conservative)
    scale = rates.num_documents / m
    gallery_fp = rates.deff_fp if rates.deff_fp_gallery is None else rates.deff_fp_gallery
    deff_tp = rates.deff_tp + (rates.deff_tp - 1.0) * scale  # relevant pairs cluster on their image
    deff_fp = rates.deff_fp + gallery_fp * scale
    k, n = rates.tp / deff_tp, rates.num_positives / deff_tp  # effective counts (module docstring)
    f, n_neg = rates.fp / deff_fp, rates.num_negatives / deff_fp
    ratios = np.array([r * (1.0 - p) / (max(m - r, 1e-12) * p) for p in levels])  # eq. (2)
    quadrature = _quadrature(k, n)  # once: the level tests and the bounds below integrate over the same Beta
    pv = _tail_sum(*quadrature, f, n_neg, np.broadcast_to(ratios, (g, len(levels)))) if levels else np.zeros((g, 0))
    tpr_lo = clopper_pearson(k, n, alpha, upper=False)

    chosen = {j: np.flatnonzero(pv[:, j] <= alpha) for j in range(len(levels))}
    chosen = {j: int(ok[-1]) for j, ok in chosen.items() if len(ok)}  # thresholds descend: largest recall last
    # a normal approximation of each candidate's ratio bound (log c): the bisection's starting point, and, for a
    # refused level's nearest miss (the highest precision any candidate certifies), the three candidates it ranks
    # highest are searched with the one closest to passing that level and those other levels chose
    with np.errstate(divide="ignore", invalid="ignore"):
        approx = np.log(np.maximum(f, 0.5) / n_neg * n / k) + stats.norm.isf(alpha) * np.sqrt(
            1.0 / np.maximum(f, 0.5) + np.clip(1.0 - k / n, 0.0, 1.0) / k
        )
    ranked = [int(i) for i in np.argsort(approx)[:3]]
    near = {j: [*ranked, int(np.argmin(pv[:, j])), *chosen.values()] for j in range(len(levels)) if j not in chosen}
    need = sorted(set(chosen.values()) | {i for c in near.values() for i in c})
    if need:
        ratio_hi = _ratio_bounds(tuple(a[need] for a in quadrature), f[need], n_neg[need], alpha, approx[need])
    else:
        ratio_hi = []
    # the highest precision each candidate's test passes at alpha (eq. 1 at its ratio bound)
    bound = {i: float(r / (r + max(m - r, 0.0) * c)) for i, c in zip(need, ratio_hi, strict=True)}
    out_levels, flat, est_levels, est_flat = {}, {}, {}, {}
    for j, p in enumerate(levels):
        key = _level_key(p)
        if j in chosen:
            i = chosen[j]
            out_levels[key] = {
                "threshold": float(rates.thresholds[i]),
                "p_value": float(pv[i, j]),
                "precision_lower_bound": max(bound[i], p),
                "recall_lower_bound": float(tpr_lo[i]),
                "recall_estimate": float(rates.tp[i] / rates.num_positives),
            }
            flat[key] = float(rates.thresholds[i])
        else:
            i = max(near[j], key=bound.get)
            best = min(bound[i], p)
            out_levels[key] = {
                "threshold": None,
                "refused": (
                    f"the calibration data ({rates.num_queries} queries x {rates.num_documents} images) cannot "
                    f"certify precision {p:g} at confidence {1 - delta:g} on a gallery of {m:,} items: the highest "
                    f"certified precision is {best:.3f} (at threshold {float(rates.thresholds[i]):.4f}); "
                    "calibrate on more labelled queries or serve a lower level"
                ),
                "best_precision_lower_bound": best,
            }
            flat[key] = None
        est = _estimate(rates, p, m, r)
        est_levels[key], est_flat[key] = est, (None if est is None else est["threshold"])
    return {
        "method": METHOD,
        "delta": float(delta),
        "confidence": 1.0 - float(delta),
        "gallery_size": m,
        "relevant_per_query": r,
        "relevant_per_query_source": r_source,
        "num_calibration_queries": rates.num_queries,
        "num_calibration_images": rates.num_documents,
        "num_candidates": g,
        "alpha_per_test": alpha,
        "threshold_at_precision": flat,
        "levels": out_levels,
        "estimated": {"threshold_at_precision": est_flat, "levels": est_levels},
    }
