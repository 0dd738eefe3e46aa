"""The one interface every searchable index implements: one index folder (brute force or ScaNN), an in-process
sharded index, and remote shards behind a router.

A caller (``serve.searcher.Searcher``) asks any of them the same two questions, ``search_topk`` and
``search_threshold_answers``, and gets beside the answer which shards made it (:class:`ShardCoverage`; None for an
unsharded index). An in-process index answers from every shard or raises, so its coverage is complete and the two
methods are written here once, over the index's own ``topk`` / ``answer_threshold``; remote shards
(``serve.router.RemoteShards``) override them to report the shards that answered within the deadline. Before this
interface the searcher told the kinds apart by probing attributes.
"""

from __future__ import annotations

import abc
import dataclasses

import numpy as np

from ce_retrieval.search.threshold import ThresholdAnswer

__all__ = ["SearchIndex", "ShardCoverage"]


@dataclasses.dataclass(frozen=True)
class ShardCoverage:
    """Which of the ``total`` shards answered a request (``answered``) and why the others did not (``missing``)."""

    total: int
    answered: list[int]
    missing: dict[int, str]

    @property
    def partial(self) -> bool:
        return bool(self.missing)

    def to_json(self) -> dict:
        """``{"answered": [...], "missing": {"<shard>": reason}, "total": S}`` (JSON object keys are strings)."""
        return {
            "answered": sorted(self.answered),
            "missing": {str(i): r for i, r in sorted(self.missing.items())},
            "total": self.total,
        }


class SearchIndex(abc.ABC):
    """Top-k and threshold search over a gallery of ``len(self)`` unit vectors of width ``dim``, described by its
    ``manifest`` (model binding, thresholds, build figures). Ids are gallery ids; scores are q.x, descending."""

    manifest: dict
    num_shards: int | None = None  # shards behind this index; None for one index folder

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @property
    @abc.abstractmethod
    def dim(self) -> int: ...

    @abc.abstractmethod
    def topk(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Gallery ids [B, k'] and scores [B, k'], k' = min(k, len(self))."""

    @abc.abstractmethod
    def answer_threshold(
        self, queries: np.ndarray, threshold: float, *, exact: bool | None = None, limit: int | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[ThresholdAnswer]]:
        """Per query, ids and scores of the items with score >= ``threshold`` and how the answer was made;
        ``exact=None``: the index's default search; with ``limit``, more than ``limit`` hits say it was cut."""

    def threshold(
        self, queries: np.ndarray, threshold: float, *, exact: bool | None = None, limit: int | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """``answer_threshold`` without the answers."""
        ids, scores, _ = self.answer_threshold(queries, threshold, exact=exact, limit=limit)
        return ids, scores

    def coverage(self) -> ShardCoverage | None:
        """An in-process index searches every shard (or raises): complete coverage; None when unsharded."""
        n = self.num_shards
        return None if n is None else ShardCoverage(total=n, answered=list(range(n)), missing={})

    def search_topk(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, ShardCoverage | None]:
        """Top-``k`` ids and scores, and the shards that answered."""
        ids, scores = self.topk(queries, k)
        return ids, scores, self.coverage()

    def search_threshold_answers(
        self, queries: np.ndarray, threshold: float, limit: int | None = None, exact: bool = False
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[bool], ShardCoverage | None, list[ThresholdAnswer]]:
        """Per query every hit with score >= ``threshold`` (the best ``limit`` when given, ``truncated`` when more
        exist), the shards that answered, and how each answer was made (``exact``: the exact search)."""
        ids, scores, answers = self.answer_threshold(
            queries, float(threshold), exact=True if exact else None, limit=limit
        )
        truncated = [limit is not None and len(i) > limit for i in ids]
        ids = [i[:limit] if cut else i for i, cut in zip(ids, truncated, strict=True)]
        scores = [s[:limit] if cut else s for s, cut in zip(scores, truncated, strict=True)]
        return ids, scores, truncated, self.coverage(), answers

    def close(self) -> None:  # noqa: B027  (a no-op by default: only a sharded index holds search threads)
        """Releases what the index holds beyond its arrays (search threads); nothing by default."""
