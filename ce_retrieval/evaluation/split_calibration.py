"""One calibration of a model on labelled data, and the thresholds it gives any served gallery.

:func:`calibrate_split` measures, once, what a served index needs to make promises about precision: the
size-free rates of relevant and irrelevant pairs at candidate thresholds with their confidence bounds
(:mod:`~ce_retrieval.evaluation.guarantee`) and the score -> P(relevant) map
(:mod:`~ce_retrieval.evaluation.probability`). Index building, evaluation, the demo and ``ce-retrieval
calibrate`` all call it, so a threshold means the same thing everywhere.

:meth:`Calibration.for_gallery` turns it into the thresholds of a gallery of M items (the index manifest's
``thresholds`` block): the guaranteed threshold per level (or the refusal and its reason), the point estimate
beside it, and the probability map moved to the served gallery's base rate. The map was fitted where a pair is
relevant with prior pi_cal = P / (N M_cal); on a gallery of M items with r relevant per query the prior is
pi = r / M, and by Bayes' rule only the prior odds change (Saerens et al. 2002):

    odds_served(s) = odds_cal(s) * [pi / (1 - pi)] / [pi_cal / (1 - pi_cal)].

The calibration itself is stored in the manifest too, so a rebuild on another gallery recomputes its thresholds
from the same measurements instead of reusing numbers that were right for another size.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ce_retrieval.evaluation.guarantee import DEFAULT_DELTA, ScoreRates, guaranteed_thresholds, measure_rates
from ce_retrieval.evaluation.probability import ProbabilityMap, fit_probability_map

__all__ = ["DEFAULT_LEVELS", "Calibration", "calibrate_split", "shift_base_rate"]

DEFAULT_LEVELS = (0.5, 0.8, 0.9)
FORMAT = "calibration/1"


def shift_base_rate(pmap: ProbabilityMap, fitted_rate: float, served_rate: float) -> ProbabilityMap:
    """The map with its prior odds moved from ``fitted_rate`` to ``served_rate`` (monotone, so still a map)."""
    y = np.clip(pmap.knots_y, 0.0, 1.0)
    k = (served_rate / (1.0 - served_rate)) / (fitted_rate / (1.0 - fitted_rate))
    with np.errstate(invalid="ignore", divide="ignore"):
        shifted = np.where(y >= 1.0, 1.0, k * y / (k * y + (1.0 - y)))
    return ProbabilityMap(pmap.knots_x.copy(), np.maximum.accumulate(shifted), pmap.num_pairs, pmap.num_positives)


@dataclasses.dataclass
class Calibration:
    """What labelled data tell about a model's scores: rates with bounds, the probability map, the levels and
    the confidence to promise, and where the labels came from."""

    rates: ScoreRates
    probability: ProbabilityMap
    levels: tuple = DEFAULT_LEVELS
    delta: float = DEFAULT_DELTA
    relevant_per_query: float | None = None  # None: as measured on the labelled data
    source: dict = dataclasses.field(default_factory=dict)

    @property
    def fitted_base_rate(self) -> float:
        return self.rates.num_positives / (self.rates.num_positives + self.rates.num_negatives)

    def for_gallery(self, gallery_size: int) -> dict:
        """The ``thresholds`` block of an index over ``gallery_size`` items (see the module docstring)."""
        promise = guaranteed_thresholds(self.rates, self.levels, self.delta, gallery_size, self.relevant_per_query)
        served_rate = min(promise["relevant_per_query"] / promise["gallery_size"], 1.0 - 1e-12)
        pmap = shift_base_rate(self.probability, self.fitted_base_rate, served_rate)
        estimated = promise.pop("estimated")
        return {
            "threshold_at_precision": estimated["threshold_at_precision"],
            "estimated": estimated,
            "guaranteed": promise,
            "probability": {
                **pmap.to_json(),
                "base_rate": {"fitted": self.fitted_base_rate, "served": served_rate},
            },
            "calibration": self.to_json(),
        }

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "rates": self.rates.to_json(),
            "probability": self.probability.to_json(),
            "levels": [float(p) for p in self.levels],
            "delta": float(self.delta),
            "relevant_per_query": self.relevant_per_query,
            "source": dict(self.source),
        }

    @classmethod
    def from_json(cls, d: dict) -> Calibration:
        if d.get("format") != FORMAT:
            raise ValueError(f"unknown calibration format {d.get('format')!r}, expected {FORMAT!r}")
        r = d.get("relevant_per_query")
        return cls(
            ScoreRates.from_json(d["rates"]),
            ProbabilityMap.from_json(d["probability"]),
            tuple(float(p) for p in d["levels"]),
            float(d["delta"]),
            None if r is None else float(r),
            dict(d.get("source") or {}),
        )


def calibrate_split(
    query_emb,
    doc_emb,
    query_ids,
    doc_ids,
    *,
    levels=DEFAULT_LEVELS,
    delta: float = DEFAULT_DELTA,
    relevant_per_query: float | None = None,
    source: dict | None = None,
    positives=None,
) -> Calibration:
    """Calibrates on every query x document pair of a labelled split (positive iff the ids are equal, or the
    pairs ``positives = (rows, cols)``: queries relevant to several documents; ``query_ids`` then only group the
    queries into units for the clustered bounds, see ``guarantee.measure_rates``)."""
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    rates = measure_rates(query_emb, doc_emb, query_ids, doc_ids, positives=positives)
    pmap = fit_probability_map(query_emb, doc_emb, query_ids, doc_ids, positives=positives)
    cal = Calibration(rates, pmap, tuple(float(p) for p in levels), float(delta), relevant_per_query, source or {})
    guaranteed_thresholds(rates, cal.levels, cal.delta, None, relevant_per_query)  # bad levels / r fail here
    return cal
