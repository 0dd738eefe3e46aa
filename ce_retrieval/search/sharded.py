"""A loaded sharded index: every shard searched in a thread pool, the answers merged exactly.

A sharded version folder (``ce_retrieval.sharded_index/1``, written by ``ce_retrieval.build.sharded``) holds S
ordinary index folders and a top-level manifest. Why searching it this way is exact over the shards' answers:

* **Exact merge** (:mod:`ce_retrieval.search.merge`): scores are absolute calibrated cosines, so the global top-k
  is the top-k of the shards' top-k lists and a threshold answer is the union of the shards' answers. Brute-force
  shards therefore give exactly the single-index answer; ScaNN shards give the merge of their own ANN answers.
* **Checks at load**: the top-level manifest must agree with every shard (model block, item counts, ids and
  embeddings checksums, assignment of every id: :mod:`ce_retrieval.search.assignment`); otherwise
  ``IndexMismatchError`` naming the shard.

:func:`load_index` opens a version folder whatever its layout (one folder or shards).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading

import numpy as np

from ce_retrieval.search import layout
from ce_retrieval.search.assignment import SHARD_ASSIGNMENT, shard_name, shard_of
from ce_retrieval.search.gallery import (
    INDEX_FORMAT,
    SHARDED_FORMAT,
    GalleryIndex,
    IndexMismatchError,
    check_compatible,
    embeddings_digest,
)
from ce_retrieval.search.interface import SearchIndex
from ce_retrieval.search.merge import merge_threshold, merge_topk
from ce_retrieval.search.threshold import ThresholdAnswer, merge_answers

__all__ = ["ShardedIndex", "load_index"]


class ShardedIndex(SearchIndex):
    """Searches a sharded index folder: the :class:`~ce_retrieval.search.interface.SearchIndex` of its
    ``shards`` (each a :class:`GalleryIndex`), fanned out to a thread pool and merged exactly. Safe to share
    between threads."""

    def __init__(self, path: str, manifest: dict, shards: list[GalleryIndex]):
        self.path, self.manifest, self.shards = path, manifest, list(shards)
        _check_shards(path, manifest, self.shards)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    @property
    def dim(self) -> int:
        return self.shards[0].dim

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @classmethod
    def load(
        cls, path: str, expected_model: dict | None = None, mmap: bool = True, *, verify_embeddings: bool = False
    ) -> ShardedIndex:
        """Loads a sharded index folder and every shard; with ``expected_model`` (the export metadata), refuses
        an index of another model. ``verify_embeddings`` also re-hashes every shard's embeddings (reads them
        whole). Raises ``IndexMismatchError`` naming the shard that disagrees with the top-level manifest."""
        path = os.path.abspath(path)
        manifest = layout.read_json(os.path.join(path, layout.INDEX_MANIFEST))
        if manifest.get("format") != SHARDED_FORMAT:
            raise IndexMismatchError(
                f"{path}: format {manifest.get('format')!r} is not a sharded index ({SHARDED_FORMAT!r})"
            )
        if expected_model is not None:
            check_compatible(manifest, expected_model, path)
        entries = manifest.get("shards") or []
        shards = []
        for entry in entries:
            folder = os.path.join(path, str(entry.get("name")))
            if not os.path.isdir(folder):
                raise IndexMismatchError(f"{path}: shard {entry.get('name')} is missing")
            try:
                shard = GalleryIndex.load(folder, expected_model=expected_model, mmap=mmap)
            except (OSError, ValueError, KeyError) as e:  # IndexMismatchError is a ValueError
                raise IndexMismatchError(f"{path}: shard {entry['name']} cannot be served: {e}") from e
            if verify_embeddings and embeddings_digest(shard.embeddings) != entry.get("embeddings_sha256"):
                raise IndexMismatchError(
                    f"{path}: shard {entry['name']}: embeddings do not match the top-level manifest's checksum"
                )
            shards.append(shard)
        return cls(path, manifest, shards)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=len(self.shards), thread_name_prefix="shard-search"
                )
            return self._pool

    def _map(self, fn) -> list:
        if len(self.shards) == 1:
            return [fn(self.shards[0])]
        return list(self._executor().map(fn, self.shards))

    def topk(self, queries: np.ndarray, k: int, **kw) -> tuple[np.ndarray, np.ndarray]:
        """Gallery ids [B, k'] and scores [B, k'], k' = min(k, len(self)): the exact merge of every shard's
        ``topk`` (keyword arguments such as ``exact=True`` go to each shard)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        answers = self._map(lambda shard: shard.topk(queries, k, **kw))
        return merge_topk([a[0] for a in answers], [a[1] for a in answers], k)

    def answer_threshold(
        self, queries: np.ndarray, threshold: float, *, exact: bool | None = None, limit: int | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[ThresholdAnswer]]:
        """Per query, ids and scores (descending, ties by id) of the items with score >= threshold: every shard runs
        ``GalleryIndex.answer_threshold`` (``exact`` / ``limit`` as there) and the union of their answers is merged
        exactly (with ``limit``, the best ``limit + 1`` of the union, so the caller still sees that it was cut);
        each query's answer is merged over the shards (``threshold.merge_answers``: exact where every shard's is,
        else approximate with the lowest shard figure)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        answers = self._map(lambda shard: shard.answer_threshold(queries, threshold, exact=exact, limit=limit))
        ids, scores = merge_threshold(
            [a[0] for a in answers], [a[1] for a in answers], None if limit is None else int(limit) + 1
        )
        per_query = zip(*(a[2] for a in answers), strict=True)  # [shard][query] -> [query][shard]
        return ids, scores, [merge_answers(list(shards)) for shards in per_query]

    def close(self) -> None:
        """Stops the search threads (they also stop when the index is garbage-collected)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None


def _check_shards(path: str, manifest: dict, shards: list[GalleryIndex]) -> None:
    """``IndexMismatchError`` naming the first shard that disagrees with the top-level manifest."""
    if manifest.get("format") != SHARDED_FORMAT:
        raise IndexMismatchError(f"{path}: format {manifest.get('format')!r} is not {SHARDED_FORMAT!r}")
    if manifest.get("shard_assignment") != SHARD_ASSIGNMENT:
        raise IndexMismatchError(f"{path}: unknown shard assignment rule {manifest.get('shard_assignment')!r}")
    num_shards = manifest.get("num_shards")
    entries = manifest.get("shards") or []
    if not isinstance(num_shards, int) or num_shards < 1 or len(entries) != num_shards or len(shards) != num_shards:
        raise IndexMismatchError(
            f"{path}: num_shards {num_shards!r}, {len(entries)} shard entries and {len(shards)} shard folders differ"
        )
    for i, (entry, shard) in enumerate(zip(entries, shards, strict=True)):
        name = shard_name(i, num_shards)
        m = shard.manifest
        problem = None
        if entry.get("name") != name:
            problem = f"entry {i} is named {entry.get('name')!r}, expected {name!r}"
        elif m.get("format") != INDEX_FORMAT:
            problem = f"format {m.get('format')!r} is not {INDEX_FORMAT!r}"
        elif m.get("model") != manifest.get("model"):
            problem = "its model block differs from the top-level manifest's (built by another export)"
        elif m.get("num_items") != entry.get("num_items"):
            problem = f"holds {m.get('num_items')} items, the top-level manifest says {entry.get('num_items')}"
        elif m["ids"]["sha256"] != entry.get("ids_sha256"):
            problem = "its ids do not match the top-level manifest's checksum"
        elif m["embeddings"].get("sha256") != entry.get("embeddings_sha256"):
            problem = "its embeddings checksum does not match the top-level manifest's"
        elif m.get("kind") != entry.get("kind"):
            problem = f"kind {m.get('kind')!r} != {entry.get('kind')!r} in the top-level manifest"
        elif np.any(shard_of(shard.ids, num_shards) != i):
            problem = "holds ids that the assignment rule puts in other shards"
        if problem:
            raise IndexMismatchError(f"{path}: shard {entry.get('name', name)}: {problem}")
    total = sum(len(s) for s in shards)
    if total != manifest.get("num_items"):
        raise IndexMismatchError(
            f"{path}: the shards hold {total} items, the top-level manifest says {manifest.get('num_items')}"
        )


def load_index(path: str, expected_model: dict | None = None, mmap: bool = True) -> GalleryIndex | ShardedIndex:
    """Loads ``<export_dir>/index/<version>/`` whatever its layout: a :class:`GalleryIndex` for a single index
    folder, a :class:`ShardedIndex` for a sharded one (chosen by the manifest's ``format``)."""
    path = os.path.abspath(path)
    fmt = layout.read_json(os.path.join(path, layout.INDEX_MANIFEST)).get("format")
    if fmt == SHARDED_FORMAT:
        return ShardedIndex.load(path, expected_model=expected_model, mmap=mmap)
    if fmt == INDEX_FORMAT:
        return GalleryIndex.load(path, expected_model=expected_model, mmap=mmap)
    raise IndexMismatchError(f"{path}: unknown index format {fmt!r} (expected {INDEX_FORMAT!r} or {SHARDED_FORMAT!r})")
