"""Scores a user can read as probabilities: a monotone map score -> P(relevant | score), and how well it holds.

A threshold for "precision 0.9" speaks about *everything* above it; one hit's reader wants the probability that
*this* image is relevant, p(s) = P(relevant | s(q, x) = s). It is fitted on the calibration split's query x image
pairs (positive iff the ids are equal) by isotonic regression: the non-decreasing p minimising

    sum_i w_i (y_i - p(s_i))^2,     y_i in {0, 1} relevance,

solved by pool-adjacent-violators. The pairs are first pooled into ``num_bins`` equal-width score bins over
[-1, 1] (per bin: pairs, positives, score sum), streamed in row blocks, so memory does not grow with N x M; a bin
enters PAV as one point at its mean score with weight = its pair count, which is exact whenever a bin's pairs lie
in one PAV block (bins are 0.001 wide by default, far below the width of any fitted step). The map is stored as
the knots of the fitted steps (each block's lowest and highest mean score) and evaluated by linear interpolation
between them, clipped to the end values (scikit-learn's ``IsotonicRegression`` prediction).

Why not Platt scaling or temperature: both fit p(s) = sigmoid(a s + b), i.e. log-odds linear in the score. The
contrastive scores of relevant and irrelevant pairs are not two equal-variance Gaussians (the case where that
holds): irrelevant pairs pile up in a narrow band near zero and relevant ones spread wide, so the true log-odds
bend, and a sigmoid is wrong at exactly the high scores a user reads. Isotonic regression assumes only that a
higher score is never less likely to be relevant, and a validation split has millions of pairs, enough for its
extra freedom; its cost is piecewise-flat output (equal probabilities within a step).

:func:`reliability` measures a map on another split: pairs are grouped by predicted probability into equal-width
bins; per bin the mean predicted and the observed share of relevant pairs (the reliability diagram), and

    ECE = sum_b (n_b / N) |observed_b - predicted_b|     (expected calibration error).

It also reports ECE per group of queries (by their number of relevant images): a map that transfers across
queries is calibrated in every group, not only on average.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from sklearn.isotonic import isotonic_regression

from ce_retrieval.evaluation._arrays import block_rows, check_pair

__all__ = ["PROBABILITY_AXES", "ProbabilityMap", "fit_probability_map", "fit_scores", "reliability"]

DEFAULT_BINS = 2000  # score bins of width 0.001 over [-1, 1]
DEFAULT_BLOCK_ELEMENTS = 1 << 21
FORMAT = "isotonic/1"
PROBABILITY_AXES = ("predicted P(relevant | score), mean per bin", "observed share of relevant pairs")


@dataclasses.dataclass
class ProbabilityMap:
    """Non-decreasing piecewise-linear map from a score to P(relevant): ``np.interp`` over the knots."""

    knots_x: np.ndarray  # float64 [K], non-decreasing scores
    knots_y: np.ndarray  # float64 [K], non-decreasing probabilities in [0, 1]
    num_pairs: int = 0
    num_positives: int = 0

    def __call__(self, scores) -> np.ndarray:
        return np.interp(np.asarray(scores, np.float64), self.knots_x, self.knots_y)

    def min_score(self, probability: float) -> float | None:
        """The lowest score whose mapped probability is at least ``probability`` (-1, the lowest cosine, when every
        score reaches it; None when none does), so "p(s) >= m" is the threshold query "s >= min_score(m)"."""
        m = float(probability)
        y, x = self.knots_y, self.knots_x
        if m > y[-1]:
            return None
        j = int(np.searchsorted(y, m, side="left"))  # first knot with y >= m
        if j == 0:
            return -1.0
        t = x[j - 1] + (m - y[j - 1]) * (x[j] - x[j - 1]) / (y[j] - y[j - 1])
        t = float(min(max(t, x[j - 1]), x[j]))
        while self(t) < m:  # rounding: step up to the first float whose probability reaches m
            t = float(np.nextafter(t, np.inf))
        return t

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "score": "cosine similarity q.x; P(relevant) by linear interpolation between knots, clipped at the ends",
            "knots_x": [round(float(v), 7) for v in self.knots_x],
            "knots_y": [round(float(v), 7) for v in self.knots_y],
            "num_pairs": int(self.num_pairs),
            "num_positives": int(self.num_positives),
        }

    @classmethod
    def from_json(cls, d: dict) -> ProbabilityMap:
        if d.get("format") != FORMAT:
            raise ValueError(f"unknown probability map format {d.get('format')!r}, expected {FORMAT!r}")
        x, y = np.asarray(d["knots_x"], np.float64), np.asarray(d["knots_y"], np.float64)
        if x.ndim != 1 or x.shape != y.shape or len(x) == 0 or np.any(np.diff(x) < 0) or np.any(np.diff(y) < 0):
            raise ValueError("probability map knots must be non-empty, equally long and non-decreasing")
        return cls(x, y, int(d.get("num_pairs", 0)), int(d.get("num_positives", 0)))


def _fit_points(x: np.ndarray, pos: np.ndarray, weight: np.ndarray) -> ProbabilityMap:
    """Weighted isotonic fit of the rates ``pos / weight`` at ascending distinct scores ``x``; knots at each
    fitted block's ends."""
    keep = weight > 0
    x, pos, weight = x[keep], pos[keep], weight[keep]
    if len(x) == 0:
        raise ValueError("no pairs to fit a probability map on")
    fitted = np.clip(isotonic_regression(pos / weight, sample_weight=weight, increasing=True), 0.0, 1.0)
    new_block = np.concatenate([[True], fitted[1:] != fitted[:-1]])
    last = np.concatenate([new_block[1:], [True]])
    ends = new_block | last
    return ProbabilityMap(x[ends], fitted[ends], int(weight.sum()), int(pos.sum()))


def fit_scores(scores, relevant, weights=None) -> ProbabilityMap:
    """Isotonic map fitted on given scores and 0/1 relevance (no binning: every distinct score is a point)."""
    s = np.asarray(scores, np.float64).reshape(-1)
    y = np.asarray(relevant, np.float64).reshape(-1)
    w = np.ones_like(s) if weights is None else np.asarray(weights, np.float64).reshape(-1)
    if not (s.shape == y.shape == w.shape):
        raise ValueError(f"scores, relevant and weights must match: {s.shape}, {y.shape}, {w.shape}")
    if np.any((y != 0) & (y != 1)) or np.any(w < 0) or not np.all(np.isfinite(s)):
        raise ValueError("relevant must be 0/1, weights non-negative and scores finite")
    u, inv = np.unique(s, return_inverse=True)
    return _fit_points(u, np.bincount(inv, w * y, len(u)), np.bincount(inv, w, len(u)))


def _pair_blocks(q, d, qids, dids, block_size):
    """``(r0, r1, scores [r, M] float32, relevant [r, M] bool)`` for row blocks of the query x document pairs."""
    rows = block_rows(block_size, len(d), DEFAULT_BLOCK_ELEMENTS)
    dt = np.ascontiguousarray(d.T)
    for r0 in range(0, len(q), rows):
        r1 = min(len(q), r0 + rows)
        yield r0, r1, q[r0:r1] @ dt, qids[r0:r1, None] == dids[None, :]


def fit_probability_map(
    query_emb, doc_emb, query_ids, doc_ids, num_bins: int = DEFAULT_BINS, block_size: int | None = None
) -> ProbabilityMap:
    """P(relevant | score) fitted by isotonic regression on every query x document pair of a split (usually the
    validation split the thresholds are calibrated on), pooled in ``num_bins`` score bins over [-1, 1]."""
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    if int(num_bins) < 2:
        raise ValueError(f"num_bins must be at least 2, got {num_bins}")
    count = np.zeros(num_bins)
    pos = np.zeros(num_bins)
    total = np.zeros(num_bins)
    for _, _, s, rel in _pair_blocks(q, d, qids, dids, block_size):
        b = np.clip(((s.reshape(-1) + 1.0) * (num_bins / 2.0)).astype(np.int64), 0, num_bins - 1)
        count += np.bincount(b, minlength=num_bins)
        pos += np.bincount(b, rel.reshape(-1), minlength=num_bins)
        total += np.bincount(b, s.reshape(-1), minlength=num_bins)
    mean = np.divide(total, count, out=np.zeros(num_bins), where=count > 0)
    return _fit_points(mean, pos, count)


def _ece(pred_sum, obs, count) -> float | None:
    n = count.sum()
    if n == 0:
        return None
    return float(np.sum(np.abs(obs - pred_sum)) / n)  # sum_b n_b |observed_b - predicted_b| / N


def _group_errors(group_of: np.ndarray, names: list[str], count, pred, obs, top) -> dict:
    """Per query group: number of queries, ECE and ECE over the bins predicted >= 0.1 (per-query arrays summed)."""
    out = {}
    for g, name in enumerate(names):
        members = group_of == g
        if members.any():
            c, p, o = count[members].sum(0), pred[members].sum(0), obs[members].sum(0)
            ece_top = _ece(p[top], o[top], c[top])
            out[name] = {"num_queries": int(members.sum()), "ece": _ece(p, o, c), "ece_top": ece_top}
    return out


def reliability(
    pmap: ProbabilityMap, query_emb, doc_emb, query_ids, doc_ids, num_bins: int = 10, block_size: int | None = None
) -> dict:
    """The map's calibration on a split: ``ece``, the reliability diagram (per equal-width bin of predicted
    probability: ``predicted`` mean, ``observed`` share of relevant pairs, ``count``), ``ece_top`` (the same
    restricted to pairs predicted >= 0.1, where a user reads a probability: the near-zero mass of irrelevant pairs
    dominates the plain ECE), and per query group (``num_queries``, ``ece``, ``ece_top``): ``ece_by_group``
    (queries by their number of relevant images) and ``ece_by_top_score`` (queries by the quartile of their
    highest score, a query property a service sees: a map that transfers across queries holds in each)."""
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    doc_id, per_id = np.unique(dids, return_counts=True)
    at = np.minimum(np.searchsorted(doc_id, qids), len(doc_id) - 1)
    num_relevant = np.where(doc_id[at] == qids, per_id[at], 0)
    # per (query, bin): pairs, sum of predictions, relevant pairs; and each query's highest score
    count = np.zeros((len(q), num_bins))
    pred = np.zeros((len(q), num_bins))
    obs = np.zeros((len(q), num_bins))
    top_score = np.empty(len(q))
    for r0, r1, s, rel in _pair_blocks(q, d, qids, dids, block_size):
        p = pmap(s.reshape(-1))
        bin_of = np.minimum((p * num_bins).astype(np.int64), num_bins - 1)
        key = np.repeat(np.arange(r1 - r0), s.shape[1]) * num_bins + bin_of
        size = (r1 - r0) * num_bins
        count[r0:r1] = np.bincount(key, minlength=size).reshape(-1, num_bins)
        pred[r0:r1] = np.bincount(key, p, minlength=size).reshape(-1, num_bins)
        obs[r0:r1] = np.bincount(key, rel.reshape(-1), minlength=size).reshape(-1, num_bins)
        top_score[r0:r1] = s.max(axis=1)
    c, ps, ob = count.sum(0), pred.sum(0), obs.sum(0)
    safe = np.maximum(c, 1)
    top = np.arange(num_bins) >= int(np.ceil(0.1 * num_bins))
    quartile = np.searchsorted(np.quantile(top_score, [0.25, 0.5, 0.75]), top_score, side="right")
    return {
        "ece": _ece(ps, ob, c),
        "ece_top": _ece(ps[top], ob[top], c[top]),
        "num_pairs": int(c.sum()),
        "bins": {
            "lower": (np.arange(num_bins) / num_bins).tolist(),
            "predicted": [float(v) if n else None for v, n in zip(ps / safe, c, strict=True)],  # None: empty bin
            "observed": [float(v) if n else None for v, n in zip(ob / safe, c, strict=True)],
            "count": c.astype(np.int64).tolist(),
        },
        "ece_by_group": _group_errors(
            np.minimum(num_relevant, 5), ["0", "1", "2", "3", "4", "5+"], count, pred, obs, top
        ),
        "ece_by_top_score": _group_errors(quartile, ["Q1 (lowest)", "Q2", "Q3", "Q4 (highest)"], count, pred, obs, top),
    }
