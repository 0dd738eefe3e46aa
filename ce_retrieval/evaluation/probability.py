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

:func:`reliability` measures a map on another split in one streamed pass: pairs are grouped by predicted
probability into equal-width bins; per bin the mean predicted and the observed share of relevant pairs (the
reliability diagram), and

    ECE = sum_b (n_b / N) |observed_b - predicted_b|     (expected calibration error).

Over all pairs the ECE cannot tell two maps apart: with P relevant among N pairs it is at most about 2 P / N (0.4
points at one relevant image in 500) for any map, and pooled over queries one query's over-confidence cancels
another's under-confidence. So it also reports what does separate them: the proper scores (Brier score, log loss,
their skill against the base rate and Murphy's reliability / resolution split, :mod:`proper_scores`), how many pairs
the map predicts >= 0.5 and >= 0.9 and the precision observed there, and the calibration error per query (each
query's own ECE over its pairs predicted >= 0.1, with the noise floor a perfectly calibrated map would show),
averaged per query group: by number of relevant images, by the query's highest score, by caption length.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from sklearn.isotonic import isotonic_regression

from ce_retrieval.evaluation._arrays import block_rows, check_pair, check_positives, relevance_block
from ce_retrieval.evaluation.proper_scores import ProperScores

__all__ = [
    "CAPTION_LENGTH_GROUPS",
    "CONFIDENT_LEVELS",
    "PROBABILITY_AXES",
    "RELEVANT_GROUPS",
    "TOP_SCORE_GROUPS",
    "ProbabilityMap",
    "caption_word_counts",
    "fit_probability_map",
    "fit_scores",
    "reliability",
]

DEFAULT_BINS = 2000  # score bins of width 0.001 over [-1, 1]
DEFAULT_BLOCK_ELEMENTS = 1 << 21
FORMAT = "isotonic/1"
PROBABILITY_AXES = ("predicted P(relevant | score), mean per bin", "observed share of relevant pairs")
TOP_PROBABILITY = 0.1  # where a user reads a probability: the per-query errors count pairs predicted at least this
CONFIDENT_LEVELS = (0.5, 0.9)
FLOOR_DRAWS = 32  # outcome draws averaged for the per-query error's noise floor
RELEVANT_GROUPS = ["0", "1", "2", "3", "4", "5+"]
TOP_SCORE_GROUPS = ["Q1 (lowest)", "Q2", "Q3", "Q4 (highest)"]
# (longest caption in the group in words, name), the last open-ended; the synthetic captions have 3-25 words
CAPTION_LENGTH_GROUPS = ((5, "<=5"), (8, "6-8"), (12, "9-12"), (17, "13-17"), (None, "18+"))


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


def _pair_blocks(q, d, qids, dids, block_size, positives=None):
    """``(r0, r1, scores [r, M] float32, relevant [r, M] bool)`` for row blocks of the query x document pairs
    (relevant: equal ids, or the given ``positives`` as ``_arrays.check_positives`` returns them)."""
    rows = block_rows(block_size, len(d), DEFAULT_BLOCK_ELEMENTS)
    dt = np.ascontiguousarray(d.T)
    for r0 in range(0, len(q), rows):
        r1 = min(len(q), r0 + rows)
        rel = qids[r0:r1, None] == dids[None, :] if positives is None else relevance_block(positives, r0, r1, len(d))
        yield r0, r1, q[r0:r1] @ dt, rel


def fit_probability_map(
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    num_bins: int = DEFAULT_BINS,
    block_size: int | None = None,
    positives=None,
) -> ProbabilityMap:
    """P(relevant | score) fitted by isotonic regression on every query x document pair of a split (usually the
    validation split the thresholds are calibrated on), pooled in ``num_bins`` score bins over [-1, 1].
    ``positives``: the relevant pairs ``(rows, cols)`` instead of id equality (queries relevant to several
    documents)."""
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    if int(num_bins) < 2:
        raise ValueError(f"num_bins must be at least 2, got {num_bins}")
    if positives is not None:
        positives = check_positives(positives, len(q), len(d), "fit_probability_map")
    count = np.zeros(num_bins)
    pos = np.zeros(num_bins)
    total = np.zeros(num_bins)
    for _, _, s, rel in _pair_blocks(q, d, qids, dids, block_size, positives):
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


def caption_word_counts(captions) -> np.ndarray:
    """Words per caption (split on whitespace; bytes decoded as UTF-8): :func:`reliability`'s ``caption_lengths``."""
    return np.array(
        [len((c.decode("utf-8", "replace") if isinstance(c, bytes) else str(c)).split()) for c in captions], np.int64
    )


def _tally(pmap: ProbabilityMap, q, d, qids, dids, num_bins: int, block_size, seed: int):
    """One pass over the pairs: per (query, probability bin) the pairs, predictions summed and relevant pairs; per
    query the error of outcomes drawn from the predictions (:func:`_drawn_error`); the proper scores; per confident
    level the pairs, relevant pairs and predictions summed; each query's highest score."""
    cells, drawn_error = np.zeros((3, len(q), num_bins)), np.zeros(len(q))
    scores, confident, top_score = ProperScores(), np.zeros((len(CONFIDENT_LEVELS), 3)), np.empty(len(q))
    rng = np.random.default_rng(seed)
    for r0, r1, s, rel in _pair_blocks(q, d, qids, dids, block_size):
        p, y = pmap(s.reshape(-1)), rel.reshape(-1)
        bin_of = np.minimum((p * num_bins).astype(np.int64), num_bins - 1)
        key = np.repeat(np.arange(r1 - r0), s.shape[1]) * num_bins + bin_of
        for k, w in enumerate((None, p, y)):
            cells[k, r0:r1] = np.bincount(key, w, minlength=(r1 - r0) * num_bins).reshape(-1, num_bins)
        drawn_error[r0:r1] = _drawn_error(rng, p, key, bin_of >= _first_top_bin(num_bins), cells[1, r0:r1])
        scores.add(p, y)
        for k, level in enumerate(CONFIDENT_LEVELS):
            at = p >= level
            confident[k] += (at.sum(), y[at].sum(), p[at].sum())
        top_score[r0:r1] = s.max(axis=1)
    return cells, drawn_error, scores.result(), confident, top_score


def _drawn_error(rng, p, key, top, pred) -> np.ndarray:
    """Per query row of a block: sum over its bins >= 0.1 of |drawn_qb - predicted_qb|, averaged over
    ``FLOOR_DRAWS`` draws of outcomes y* ~ Bernoulli(p) for its pairs predicted >= 0.1 (``rng.random`` of shape
    [pairs, draws] in row-major pair order, so the draws do not depend on the block size). Only the occupied
    (query, bin) cells are held."""
    rows, num_bins = pred.shape
    hit = rng.random((int(top.sum()), FLOOR_DRAWS)) < p[top, None]
    cell, at = np.unique(key[top], return_inverse=True)
    slot = at[:, None] * FLOOR_DRAWS + np.arange(FLOOR_DRAWS)
    drawn = np.bincount(slot.reshape(-1), hit.reshape(-1), len(cell) * FLOOR_DRAWS).reshape(-1, FLOOR_DRAWS)
    error = np.abs(drawn - pred.reshape(-1)[cell, None]).mean(1)
    return np.bincount(cell // num_bins, error, rows)


def _first_top_bin(num_bins: int) -> int:
    return int(np.ceil(TOP_PROBABILITY * num_bins))  # bins from here hold the pairs predicted >= 0.1


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


def _per_query_errors(count, pred, obs, drawn_error, top) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per query, over its pairs predicted >= 0.1 (bins ``top``): the pairs n_q, the error
    sum_b |observed_qb - predicted_qb| / n_q and the mean drawn one (NaN where n_q = 0)."""
    n = count[:, top].sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return n, np.abs(obs - pred)[:, top].sum(1) / n, drawn_error / n


def _mean_per_query(members: np.ndarray, n, error, floor) -> dict:
    scored = members & (n > 0)
    k = int(scored.sum())
    return {
        "num_queries": int(members.sum()),
        "num_measured": k,
        "error": float(error[scored].mean()) if k else None,
        "floor": float(floor[scored].mean()) if k else None,
    }


def _confident(sums: np.ndarray) -> dict:
    """Per level: pairs predicted at least that, the share of them relevant, their mean prediction."""
    out = {}
    for level, (n, relevant, predicted) in zip(CONFIDENT_LEVELS, sums, strict=True):
        out[f"{level:g}"] = {
            "num_pairs": int(n),
            "precision": float(relevant / n) if n else None,
            "mean_predicted": float(predicted / n) if n else None,
        }
    return out


def _query_groups(num_relevant, top_score, caption_lengths) -> dict:
    """``{grouping: (group index per query, group names)}``: by number of relevant images, by quartile of the
    highest score, and (given) by caption length in words."""
    quartile = np.searchsorted(np.quantile(top_score, [0.25, 0.5, 0.75]), top_score, side="right")
    groups = {
        "by_relevant": (np.minimum(num_relevant, 5), RELEVANT_GROUPS),
        "by_top_score": (quartile, TOP_SCORE_GROUPS),
    }
    if caption_lengths is not None:
        lengths = np.asarray(caption_lengths).reshape(-1)
        if len(lengths) != len(top_score):
            raise ValueError(f"caption_lengths has {len(lengths)} entries for {len(top_score)} queries")
        edges = [hi for hi, _ in CAPTION_LENGTH_GROUPS[:-1]]
        groups["by_caption_length"] = (
            np.searchsorted(edges, lengths, side="left"),
            [name for _, name in CAPTION_LENGTH_GROUPS],
        )
    return groups


def reliability(
    pmap: ProbabilityMap,
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    num_bins: int = 10,
    block_size: int | None = None,
    caption_lengths=None,
    seed: int = 0,
) -> dict:
    """The map's calibration on a split, in one streamed pass over its query x image pairs.

    * ``ece`` and the reliability diagram ``bins`` (per equal-width bin of predicted probability: ``predicted``
      mean, ``observed`` share of relevant pairs, ``count``); ``ece_top``, the same over pairs predicted >= 0.1;
      ``ece_by_group`` / ``ece_by_top_score``: both per query group, pooled over the group's queries.
    * ``scores``: Brier score, log loss, their skill against the base rate and Murphy's decomposition
      (:mod:`ce_retrieval.evaluation.proper_scores`).
    * ``confident``: per level 0.5 and 0.9, the pairs predicted at least that (``num_pairs``), the share of them
      relevant (``precision``) and their ``mean_predicted``.
    * ``per_query``: calibration error per query, averaged over the queries of each group (``all``; ``by_relevant``,
      ``by_top_score``, and with ``caption_lengths`` (words per query, :func:`caption_word_counts`)
      ``by_caption_length``): ``num_queries``, ``num_measured`` (those with a pair predicted >= 0.1), ``error``,
      ``floor``.

    Why per query: the plain ECE is bounded by about 2 P / N (P relevant among N pairs: 0.4 points at 1 in 500) for
    any map, and a group's pooled ECE lets one query's over-confidence cancel another's under-confidence. Per query
    q, over its pairs predicted >= 0.1 in the diagram's bins b (n_q pairs),

        error_q = sum_b |observed_qb - predicted_qb| / n_q        (sums of relevance and of predictions per bin)

    is the query's own ECE where a user reads a probability; a group's ``error`` is its mean over the group's
    queries that have such pairs (each query counts once: the cross-example claim is that one map holds for each
    query). A query has few such pairs, so even a perfectly calibrated map scores well above 0 (one pair predicted
    0.3 scores 0.7 or 0.3): ``floor`` is the same mean for outcomes drawn from the predictions (y* ~ Bernoulli(p),
    averaged over 32 draws seeded by ``seed``), the sampling noise in ``error``; ``error - floor`` is what the map's
    own miscalibration adds. The draws are independent per pair; a query's real outcomes are not (it has a fixed
    number of relevant images), so a calibrated map can score somewhat below the floor.
    """
    q, d, qids, dids = check_pair(query_emb, doc_emb, query_ids, doc_ids)
    doc_id, per_id = np.unique(dids, return_counts=True)
    at = np.minimum(np.searchsorted(doc_id, qids), len(doc_id) - 1)
    num_relevant = np.where(doc_id[at] == qids, per_id[at], 0)
    (count, pred, obs), drawn_error, scores, confident, top_score = _tally(
        pmap, q, d, qids, dids, num_bins, block_size, seed
    )
    c, ps, ob = count.sum(0), pred.sum(0), obs.sum(0)
    safe = np.maximum(c, 1)
    top = np.arange(num_bins) >= _first_top_bin(num_bins)
    n_top, error, floor = _per_query_errors(count, pred, obs, drawn_error, top)
    groups = _query_groups(num_relevant, top_score, caption_lengths)
    per_query = {"all": _mean_per_query(np.ones(len(q), bool), n_top, error, floor)}
    for grouping, (group_of, names) in groups.items():
        per_query[grouping] = {
            name: _mean_per_query(group_of == g, n_top, error, floor)
            for g, name in enumerate(names)
            if np.any(group_of == g)
        }
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
        "ece_by_group": _group_errors(*groups["by_relevant"], count, pred, obs, top),
        "ece_by_top_score": _group_errors(*groups["by_top_score"], count, pred, obs, top),
        "scores": scores,
        "confident": _confident(confident),
        "per_query": per_query,
    }
