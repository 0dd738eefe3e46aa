"""Text -> image search over an export (used by the ``ce-retrieval query`` command and the service).

``Searcher.load(export_dir)`` takes the newest version that has both encoders and an index, loads the text
encoder SavedModel and the index, and refuses to pair them unless the index was built by that model
(fingerprint, dimension) and the reloaded text encoder reproduces its stored probe embeddings.

Two questions, as in the paper:
  * top-k relevancy      ``search(texts, k=10)``            the k images with the largest s(q, x) = q.x;
  * threshold relevancy  ``search(texts, threshold=tau)``   every image with s(q, x) >= tau, exactly;
                         ``search(texts, precision=0.9)``   tau = the guaranteed threshold for precision 0.9 on
                                                            this gallery: precision >= 0.9 on new queries with
                                                            the manifest's confidence 1 - delta
                                                            (``evaluation.guarantee``); a level the calibration
                                                            cannot certify raises :class:`PromiseRefused` with
                                                            the reason. ``guarantee=False``: the point estimate.
                         ``search(texts, min_probability=0.9)``  every image whose P(relevant | score) >= 0.9
                                                            (the manifest's isotonic map, fitted on validation).
Threshold queries use the index's default search (approximate where its build measured the set recall, see
``search.threshold``); ``exact=True`` asks for the exact one. Scores are the calibrated cosine similarities;
each hit also reports the highest calibrated precision level its score clears (``precision_level``: "at least
90 % of pairs this high were relevant on validation data") and, when the index carries a probability map,
``probability``: P(this image is relevant | its score), from the same validation data.

Sharded galleries: ``load`` serves a sharded ``index/<v>`` in-process (``search.sharded.load_index`` picks the
index type from the manifest); ``router.remote_searcher`` pairs the local text encoder with remote shard servers
(through ``with_index``; this module does not import the router). Either way every result then carries its shard
coverage (:class:`~ce_retrieval.search.interface.ShardCoverage`: which shards answered, which did not and why), and
``to_json`` reports it; results of an unsharded index carry none and their JSON is unchanged.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ce_retrieval.build.export import TEXT_INPUT, load_signature
from ce_retrieval.evaluation.probability import ProbabilityMap
from ce_retrieval.search import layout
from ce_retrieval.search.gallery import IndexMismatchError
from ce_retrieval.search.interface import SearchIndex, ShardCoverage
from ce_retrieval.search.sharded import load_index
from ce_retrieval.search.threshold import ThresholdAnswer

PROBE_ATOL = 1e-4


class PromiseRefused(ValueError):
    """A precision this index cannot promise (its calibration does not certify the level, or it has no
    guaranteed thresholds at all); the message says why and what to do."""


@dataclasses.dataclass
class QueryResult:
    ids: np.ndarray  # int64 [m]
    scores: np.ndarray  # float32 [m], descending
    precision_levels: list  # per hit: highest calibrated precision whose threshold the score clears, or None
    truncated: bool = False  # threshold search returned more than ``limit`` hits; only the best are kept
    coverage: ShardCoverage | None = None  # sharded index only: which shards answered
    probabilities: list | None = None  # per hit: P(relevant | score) from the manifest's map, or None without one
    answer: ThresholdAnswer | None = None  # threshold results: exact, or approximate with its measured set recall

    @property
    def partial(self) -> bool:
        """True when some shard did not answer: the hits are exact over the shards that did, not the gallery."""
        return self.coverage is not None and self.coverage.partial

    @property
    def shards_answered(self) -> list[int]:
        return [] if self.coverage is None else list(self.coverage.answered)

    @property
    def shards_missing(self) -> dict[int, str]:
        return {} if self.coverage is None else dict(self.coverage.missing)

    def to_json(self, coverage: bool = True) -> dict:
        """Hits as JSON; a threshold result also ``answer`` (``{"exact", "set_recall", "reason"}``: how it was made,
        ``threshold.ThresholdAnswer``); with a sharded index (and ``coverage``) also ``partial``,
        ``shards_answered`` and ``shards_missing`` (shard number as a string -> reason)."""
        probs = self.probabilities or [None] * len(self.ids)
        out = {
            "hits": [
                {"id": int(i), "score": round(float(s), 6), "precision_level": p, "probability": q}
                for i, s, p, q in zip(self.ids, self.scores, self.precision_levels, probs, strict=True)
            ],
            "num_hits": int(len(self.ids)),
            "truncated": self.truncated,
        }
        if self.answer is not None:
            out["answer"] = self.answer.to_json()
        if coverage and self.coverage is not None:
            cov = self.coverage.to_json()
            out.update(partial=self.partial, shards_answered=cov["answered"], shards_missing=cov["missing"])
        return out


def _validate_texts(texts) -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
        if not t.strip():
            raise ValueError(f"texts[{i}] is empty")
    return texts


class Searcher:
    """An immutable (text encoder, index) pair of one export version; safe to share between threads."""

    def __init__(self, export_dir: str, version: int, text_signature, metadata: dict, index: SearchIndex):
        self.export_dir, self.version = export_dir, version
        self._text_fn, self.metadata, self.index = text_signature, metadata, index
        block = index.manifest.get("thresholds") or {}
        raw = block.get("threshold_at_precision") or {}
        self.thresholds = {float(p): float(t) for p, t in raw.items() if t is not None}  # estimated
        self.guarantee = block.get("guaranteed")  # None: an index without guaranteed thresholds
        offered = (self.guarantee or {}).get("threshold_at_precision") or {}
        self.guaranteed_thresholds = {float(p): (None if t is None else float(t)) for p, t in offered.items()}
        pmap = block.get("probability")
        self.probability_map = None if pmap is None else ProbabilityMap.from_json(pmap)

    @classmethod
    def load(cls, export_dir: str, version: int | None = None, *, verify: bool = True) -> Searcher:
        """The text encoder and the index (single or sharded, in-process) of ``version`` (default: newest)."""

        def open_index(index_dir: str, meta: dict):
            return load_index(index_dir, expected_model=meta, mmap=True)

        return cls.with_index(export_dir, version, open_index, verify=verify)

    @classmethod
    def with_index(cls, export_dir: str, version: int | None, open_index, *, verify: bool = True) -> Searcher:
        """The text encoder of ``version`` (default: newest servable) with the index ``open_index(index_dir,
        export_metadata)`` returns, any :class:`~ce_retrieval.search.interface.SearchIndex`: a GalleryIndex or
        ShardedIndex (``load``), or the router's remote shards
        (:func:`ce_retrieval.serve.router.remote_searcher`), which must check the index against the model."""
        export_dir = os.path.abspath(export_dir)
        version = _servable_version(export_dir, version)
        meta = layout.export_metadata(export_dir, layout.TEXT_ENCODER, version)
        index = open_index(layout.version_dir(export_dir, layout.INDEX, version), meta)
        return cls(export_dir, version, _load_text_encoder(export_dir, version, meta, verify), meta, index)

    @property
    def num_shards(self) -> int | None:
        """Number of shards of a sharded index (in-process or remote), None for a single index."""
        return self.index.num_shards

    @property
    def logit_scale(self) -> float | None:
        return self.metadata.get("logit_scale")

    @property
    def logit_bias(self) -> float | None:
        return self.metadata.get("logit_bias")

    def embed(self, texts, batch_size: int = 256) -> np.ndarray:
        """float32 [B, d] unit-norm caption embeddings from the exported text encoder."""
        import tensorflow as tf

        texts = _validate_texts(texts)
        out = [
            self._text_fn(**{TEXT_INPUT: tf.constant(texts[i : i + batch_size], dtype=tf.string)})["embedding"].numpy()
            for i in range(0, len(texts), batch_size)
        ]
        return np.concatenate(out, axis=0) if out else np.zeros((0, self.index.dim), np.float32)

    @property
    def offered_precisions(self) -> list[float]:
        """The precision levels this index was calibrated for (guaranteed or refused, and estimated)."""
        return sorted(set(self.thresholds) | set(self.guaranteed_thresholds))

    def threshold_for_precision(self, precision: float, guarantee: bool = True) -> float:
        """The threshold for ``precision``: guaranteed (default) or the point estimate (``guarantee=False``).
        ValueError for a level the index was not calibrated for; :class:`PromiseRefused` when it cannot
        guarantee the level."""
        key = float(precision)
        if guarantee:
            if self.guarantee is None:
                raise PromiseRefused(
                    "this index carries no guaranteed thresholds (built without a calibration split, or from "
                    "thresholds alone): rebuild it with --calibration_split or run `ce-retrieval calibrate`, or ask "
                    "for the estimate (guarantee false)"
                )
            if key not in self.guaranteed_thresholds:
                offered = ", ".join(format(p, "g") for p in sorted(self.guaranteed_thresholds)) or "none"
                raise ValueError(f"no calibrated threshold for precision {precision:g}; available: {offered}")
            tau = self.guaranteed_thresholds[key]
            if tau is None:
                level = (self.guarantee.get("levels") or {}).get(format(key, "g")) or {}
                raise PromiseRefused(
                    f"precision {precision:g} is not guaranteed: "
                    + level.get("refused", "the calibration data cannot certify it")
                )
            return tau
        if key not in self.thresholds:
            available = (
                ", ".join(format(p, "g") for p in sorted(self.thresholds)) or "none (index built without calibration)"
            )
            raise ValueError(f"no calibrated threshold for precision {precision:g}; available: {available}")
        return self.thresholds[key]

    def threshold_for_probability(self, probability: float) -> float:
        """The lowest score whose P(relevant | score) reaches ``probability`` (ValueError without a map, or when
        no score reaches it)."""
        if self.probability_map is None:
            raise ValueError("this index has no probability map (build it with a calibration split)")
        tau = self.probability_map.min_score(probability)
        if tau is None:
            top = float(self.probability_map.knots_y[-1])
            raise ValueError(f"no score reaches probability {probability:g}; the highest is {top:.4g}")
        return tau

    def probabilities(self, scores: np.ndarray) -> list | None:
        if self.probability_map is None:
            return None
        return [round(float(p), 6) for p in self.probability_map(scores)]

    def precision_levels(self, scores: np.ndarray) -> list:
        levels = sorted(self.thresholds.items())
        return [max((p for p, t in levels if s >= t), default=None) for s in np.asarray(scores).tolist()]

    def search(
        self,
        texts,
        k: int | None = None,
        *,
        threshold: float | None = None,
        precision: float | None = None,
        min_probability: float | None = None,
        limit: int | None = None,
        exact: bool = False,
        guarantee: bool = True,
    ) -> list[QueryResult]:
        """One :class:`QueryResult` per text: top ``k``, or every item with score >= ``threshold`` (or the
        guaranteed threshold for ``precision``, its estimate with ``guarantee=False``, or the lowest score of
        probability ``min_probability``). ``limit`` caps threshold results (best first; ``truncated``); ``exact``
        asks for the exact threshold search."""
        if sum(x is not None for x in (k, threshold, precision, min_probability)) != 1:
            raise ValueError("give exactly one of k, threshold, precision or min_probability")
        return self.search_embeddings(
            self.embed(texts),
            k,
            threshold=threshold,
            precision=precision,
            min_probability=min_probability,
            limit=limit,
            exact=exact,
            guarantee=guarantee,
        )

    def search_embeddings(
        self,
        queries: np.ndarray,
        k: int | None = None,
        *,
        threshold: float | None = None,
        precision: float | None = None,
        min_probability: float | None = None,
        limit: int | None = None,
        exact: bool = False,
        guarantee: bool = True,
    ) -> list[QueryResult]:
        if precision is not None:
            threshold = self.threshold_for_precision(precision, guarantee)
        if min_probability is not None:
            threshold = self.threshold_for_probability(min_probability)
        if k is not None:
            if int(k) < 1:
                raise ValueError(f"k must be >= 1, got {k}")
            if exact:
                raise ValueError("exact applies to threshold queries (threshold, precision, min_probability)")
            ids, scores, coverage = self.index.search_topk(queries, int(k))
            return [
                QueryResult(i, s, self.precision_levels(s), coverage=coverage, probabilities=self.probabilities(s))
                for i, s in zip(ids, scores, strict=True)
            ]
        ids, scores, truncated, coverage, answers = self.index.search_threshold_answers(
            queries, float(threshold), limit, exact
        )
        return [
            QueryResult(
                i,
                s,
                self.precision_levels(s),
                truncated=bool(cut),
                coverage=coverage,
                probabilities=self.probabilities(s),
                answer=a,
            )
            for i, s, cut, a in zip(ids, scores, truncated, answers, strict=True)
        ]


def _servable_version(export_dir: str, version: int | None) -> int:
    servable = layout.servable_versions(export_dir)
    if version is None:
        if not servable:
            raise FileNotFoundError(
                f"{export_dir} has no version with both encoders and an index "
                "(run `ce-retrieval export` and `ce-retrieval index`)"
            )
        return servable[-1]
    if version not in servable:
        raise FileNotFoundError(f"version {version} of {export_dir} is not servable; servable: {servable}")
    return version


def _load_text_encoder(export_dir: str, version: int, meta: dict, verify: bool):
    """The text encoder's serving function; with ``verify``, it must reproduce the probe embeddings of the export."""
    _, fn = load_signature(layout.version_dir(export_dir, layout.TEXT_ENCODER, version))
    if verify:
        import tensorflow as tf

        probe = meta["probe"]
        got = fn(**{TEXT_INPUT: tf.constant(probe["texts"])})["embedding"].numpy()
        want = np.asarray(probe["text_embeddings"], dtype=np.float32)
        if got.shape != want.shape or not np.allclose(got, want, atol=PROBE_ATOL):
            raise IndexMismatchError(
                f"text_encoder/{version} does not reproduce the probe embeddings recorded "
                "at export: the SavedModel was changed or is corrupt"
            )
    return fn
