"""The router side of a sharded gallery: fan a query out to shard servers, merge exactly, say who answered.

A sharded index splits the gallery into S disjoint shards, each served by a shard server
(:mod:`ce_retrieval.serve.shard_server`: separate processes on one machine, separate machines in production).
The router (``ce-retrieval serve --shard_urls URL0,URL1,...``, URL i serving shard i) embeds the texts with the
local text encoder and sends the query embeddings to every shard at once (a thread pool over one keep-alive
``httpx`` client), each under the same deadline, ``timeout_s`` from the start of the fan-out:

* top-k: the global top-k is the top-k of the shards' top-k lists (:func:`~ce_retrieval.search.merge.merge_topk`);
* threshold: the hits with score >= t are the union of the shards' hits (``merge_threshold``). One global
  calibrated threshold is valid on every shard because scores are absolute cosines, not per-shard ranks. With a
  ``limit`` each shard sends its best ``limit`` hits, which contain the best ``limit`` of the union.

Shard coverage (:class:`ShardCoverage`) travels with every answer: the shards that answered and, for the others,
why not (``connection refused``, ``timeout``, ``version not loaded`` (409), ``HTTP 5xx``, a malformed answer).
An answer missing some shards is exact over the shards that answered and is flagged partial, never silently
short; when no shard answers, :class:`ShardsUnavailableError`. The GalleryIndex-like ``topk`` / ``threshold``
of :class:`RemoteShards` refuse a partial answer outright.

Versions (:class:`ShardRouter`): a router serves version V only once EVERY shard server reports V loaded in its
``/healthz`` (and holding the ids the sharded manifest records), polled every reload interval. Until then it
keeps serving the previous version, which the shard servers keep loaded next to the new one. A shard that never
gets V (down, failed to load it) holds the whole router on V-1; the router logs which shards lack V and why. If
two versions are published faster than every shard picks them up, the router's version can leave the shards'
newest two; its requests then get 409s (reported as missing shards) until every shard has a common version.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import threading
import time

import numpy as np

from ce_retrieval.search import layout
from ce_retrieval.search.gallery import SHARDED_FORMAT, IndexMismatchError, check_compatible
from ce_retrieval.search.interface import SearchIndex, ShardCoverage
from ce_retrieval.search.merge import merge_threshold, merge_topk
from ce_retrieval.search.threshold import ThresholdAnswer, merge_answers
from ce_retrieval.serve.searcher import Searcher
from ce_retrieval.serve.wire import SEARCH_PATH, ShardsUnavailableError, encode_queries

__all__ = [
    "RemoteShards",
    "ShardClient",
    "ShardFailure",
    "ShardRouter",
    "remote_searcher",
]

log = logging.getLogger("ce_retrieval.serving.router")  # log names kept from before the serving/ split
JSON_HEADERS = {"content-type": "application/json"}


class ShardFailure(Exception):
    """One shard's request failed; ``reason`` is what the coverage reports."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _error_of(response) -> str:
    try:
        return str(response.json().get("error"))
    except Exception:
        return response.text[:200]


class ShardClient:
    """HTTP transport to S shard servers (URL i serves shard i), shared by every version a router serves.

    ``search(payload)`` posts the same body to every shard concurrently and waits at most ``timeout_s`` from the
    start; requests still running then are reported as timed out (their threads end by httpx's own timeout, the
    same length). Safe to use from many threads."""

    def __init__(self, urls: list[str], *, timeout_s: float = 1.0, max_concurrency: int = 8):
        import httpx

        urls = [u.strip().rstrip("/") for u in urls]
        if not urls:
            raise ValueError("give at least one shard URL")
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"shard URLs must start with http:// or https://: {', '.join(bad)}")
        if len(set(urls)) != len(urls):
            raise ValueError(f"the same shard URL is given twice: {urls}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.urls, self.timeout_s = urls, float(timeout_s)
        workers = min(512, 2 * len(urls) * max(1, int(max_concurrency)))
        # keep-alive shorter than uvicorn's 5 s, so a pooled connection is not reused just as the server closes it;
        # trust_env=False: no proxy from the environment between the router and its shards
        self._http = httpx.Client(
            limits=httpx.Limits(max_connections=workers, max_keepalive_connections=workers, keepalive_expiry=2.0),
            trust_env=False,
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ce-shard-call")

    @property
    def num_shards(self) -> int:
        return len(self.urls)

    def _timeout(self) -> str:
        return f"timeout: no answer within {self.timeout_s:g} s"

    def _post(self, shard: int, path: str, body: bytes, deadline: float) -> dict:
        import httpx

        url = self.urls[shard] + path
        for attempt in (0, 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ShardFailure(self._timeout())
            try:
                response = self._http.post(url, content=body, headers=JSON_HEADERS, timeout=remaining)
                break
            except httpx.TimeoutException:
                raise ShardFailure(self._timeout()) from None
            except httpx.ConnectError as exc:
                refused = "refused" in str(exc).lower()
                raise ShardFailure(f"connection refused ({url})" if refused else f"cannot connect: {exc}") from None
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                if attempt == 0:  # a kept-alive connection the server had just closed: once more, on a fresh one
                    continue
                raise ShardFailure(f"connection lost: {exc or type(exc).__name__}") from None
            except httpx.HTTPError as exc:
                raise ShardFailure(f"{type(exc).__name__}: {exc}") from None
        if response.status_code == 409:
            raise ShardFailure(f"version not loaded (409): {_error_of(response)}")
        if response.status_code != 200:
            raise ShardFailure(f"HTTP {response.status_code}: {_error_of(response)}")
        try:
            return response.json()
        except ValueError:
            raise ShardFailure("malformed answer: not JSON") from None

    def search(self, payload: dict, path: str = SEARCH_PATH) -> tuple[list[dict | None], ShardCoverage]:
        """Per shard its JSON answer or None, and the coverage."""
        body = json.dumps(payload).encode("utf-8")
        deadline = time.monotonic() + self.timeout_s
        futures = {self._pool.submit(self._post, i, path, body, deadline): i for i in range(self.num_shards)}
        done, _ = concurrent.futures.wait(futures, timeout=self.timeout_s)
        answers: list[dict | None] = [None] * self.num_shards
        missing: dict[int, str] = {}
        for future, shard in futures.items():
            if future not in done:
                future.cancel()  # still queued: never sent; running: ends by httpx's timeout
                missing[shard] = self._timeout()
                continue
            try:
                answers[shard] = future.result()
            except ShardFailure as exc:
                missing[shard] = exc.reason
            except Exception as exc:  # a bug must show up as a reason, not take the request down
                missing[shard] = f"{type(exc).__name__}: {exc}"
        answered = [i for i, a in enumerate(answers) if a is not None]
        return answers, ShardCoverage(self.num_shards, answered, missing)

    def health(self, timeout_s: float | None = None) -> list[dict]:
        """Each shard server's ``/healthz`` body (``versions``, ``loaded``, ``shard``), or ``{"error": ...}``."""
        timeout = max(1.0, self.timeout_s) if timeout_s is None else timeout_s

        def one(i):
            url = self.urls[i]
            try:
                body = self._http.get(url + "/healthz", timeout=timeout).json()
            except Exception as exc:
                reason = "connection refused" if "refused" in str(exc).lower() else f"{type(exc).__name__}: {exc}"
                return {"shard": i, "url": url, "versions": [], "error": reason}
            if not isinstance(body, dict) or body.get("shard") != i:
                got = body.get("shard") if isinstance(body, dict) else body
                return {"shard": i, "url": url, "versions": [], "error": f"{url} serves shard {got}, not shard {i}"}
            return dict(body, url=url, error=None)

        return list(self._pool.map(one, range(self.num_shards)))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()


def _check_answer(answer, shard: int, version: int, num_queries: int, uniform: bool) -> str | None:
    """What is wrong with a shard server's JSON answer, or None (a top-k answer has equally long rows)."""
    if not isinstance(answer, dict):
        return "not a JSON object"
    if answer.get("version") != version or answer.get("shard") != shard:
        return f"for version {answer.get('version')} shard {answer.get('shard')}, asked version {version} shard {shard}"
    results = answer.get("results")
    if not isinstance(results, list) or len(results) != num_queries:
        return f"{len(results) if isinstance(results, list) else 'no'} results for {num_queries} queries"
    for r in results:
        if not (isinstance(r, dict) and isinstance(r.get("ids"), list) and isinstance(r.get("scores"), list)):
            return "a result without 'ids' and 'scores' lists"
        if len(r["ids"]) != len(r["scores"]):
            return "a result with different numbers of ids and scores"
    if uniform and len({len(r["ids"]) for r in results}) > 1:
        return "top-k rows of different lengths"
    return None


class RemoteShards(SearchIndex):
    """Version ``version`` of a sharded index served by shard servers, as a
    :class:`~ce_retrieval.search.interface.SearchIndex`: ``search_topk`` / ``search_threshold_answers`` answer from
    the shards that answered and report them (:class:`ShardCoverage`); the strict ``topk`` / ``answer_threshold``
    / ``threshold`` raise unless every shard answered."""

    def __init__(self, client: ShardClient, version: int, manifest: dict):
        if manifest.get("format") != SHARDED_FORMAT:
            raise IndexMismatchError(
                f"index version {version} is not a sharded index (format {manifest.get('format')!r}); "
                "a router needs one built with num_shards"
            )
        if manifest.get("num_shards") != client.num_shards or len(manifest.get("shards") or []) != client.num_shards:
            raise IndexMismatchError(
                f"index version {version} has {manifest.get('num_shards')} shards but the router was given "
                f"{client.num_shards} shard URLs"
            )
        self.client, self.version, self.manifest = client, int(version), manifest
        self.num_shards = client.num_shards
        self._size = sum(int(s["num_items"]) for s in manifest["shards"])

    def __len__(self) -> int:
        return self._size

    @property
    def dim(self) -> int:
        return int(self.manifest["model"]["embedding_dim"])

    def _fan_out(self, queries, mode: dict) -> tuple[np.ndarray, list[list[dict] | None], ShardCoverage]:
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"queries must be a [B, {self.dim}] array, got shape {q.shape}")
        answers, coverage = self.client.search({"version": self.version, "queries_b64": encode_queries(q), **mode})
        results: list[list[dict] | None] = [None] * self.num_shards
        missing = dict(coverage.missing)
        for shard, answer in enumerate(answers):
            if answer is not None:
                problem = _check_answer(answer, shard, self.version, len(q), uniform="k" in mode)
                if problem:
                    missing[shard] = f"malformed answer: {problem}"
                else:
                    results[shard] = answer["results"]
        answered = [i for i, r in enumerate(results) if r is not None]
        coverage = ShardCoverage(self.num_shards, answered, missing)
        if not answered:
            raise ShardsUnavailableError(coverage)
        return q, results, coverage

    def search_topk(self, queries, k: int) -> tuple[np.ndarray, np.ndarray, ShardCoverage]:
        """Top-``k`` ids [B, k'] and scores [B, k'] over the shards that answered, and the coverage."""
        q, results, coverage = self._fan_out(queries, {"k": int(k)})
        rows = [results[s] for s in coverage.answered]
        ids = [np.asarray([r["ids"] for r in shard], np.int64).reshape(len(q), -1) for shard in rows]
        scores = [np.asarray([r["scores"] for r in shard], np.float32).reshape(len(q), -1) for shard in rows]
        merged_ids, merged_scores = merge_topk(ids, scores, int(k))
        return merged_ids, merged_scores, coverage

    def search_threshold_answers(
        self, queries, threshold: float, limit: int | None = None, exact: bool = False
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[bool], ShardCoverage, list[ThresholdAnswer]]:
        """Per query every hit with score >= ``threshold`` over the shards that answered (the best ``limit`` when
        given, ``truncated`` when more exist), the coverage, and each query's answer merged over the shards that
        answered (``threshold.merge_answers``; a shard server that sends none counts as approximate, recall
        unknown). Each shard runs its own threshold search (its index's default, or exact with ``exact``); the
        merge is exact over what they return."""
        mode = {"threshold": float(threshold)}
        if limit is not None:
            mode["limit"] = int(limit)
        if exact:
            mode["exact"] = True
        q, results, coverage = self._fan_out(queries, mode)
        per_ids = [[np.asarray(r["ids"], np.int64) for r in results[s]] for s in coverage.answered]
        per_scores = [[np.asarray(r["scores"], np.float32) for r in results[s]] for s in coverage.answered]
        ids, scores = merge_threshold(per_ids, per_scores, limit)
        truncated = [
            any(results[s][b].get("truncated") for s in coverage.answered)
            or (limit is not None and sum(len(results[s][b]["ids"]) for s in coverage.answered) > limit)
            for b in range(len(q))
        ]
        answers = [
            merge_answers([ThresholdAnswer.from_json(results[s][b].get("answer")) for s in coverage.answered])
            for b in range(len(q))
        ]
        return ids, scores, truncated, coverage, answers

    def topk(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Like ``GalleryIndex.topk``; raises :class:`ShardsUnavailableError` unless every shard answered."""
        ids, scores, coverage = self.search_topk(queries, k)
        if coverage.partial:
            raise ShardsUnavailableError(coverage, "not every shard answered")
        return ids, scores

    def answer_threshold(
        self, queries, threshold: float, *, exact: bool | None = None, limit: int | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[ThresholdAnswer]]:
        """Like ``GalleryIndex.answer_threshold`` (with ``limit``, the best ``limit + 1``, so more than ``limit``
        hits say it was cut); raises unless every shard answered with all the hits asked for."""
        cap = None if limit is None else int(limit) + 1
        ids, scores, truncated, coverage, answers = self.search_threshold_answers(queries, threshold, cap, bool(exact))
        if coverage.partial:
            raise ShardsUnavailableError(coverage, "not every shard answered")
        if limit is None and any(truncated):
            raise RuntimeError("a shard server capped its threshold hits (its max_results); give a limit")
        return ids, scores, answers


class ShardRouter:
    """The version rule and loader of a router service over ``urls`` (URL i serves shard i).

    ``ready_versions(export_dir)`` (the service's reload candidates) polls every shard's ``/healthz`` and returns
    the servable versions of the local export that every shard has loaded with the ids the manifest records;
    ``load(export_dir, version)`` builds the :class:`~ce_retrieval.serve.searcher.Searcher` (local text
    encoder + :class:`RemoteShards`); ``health_json()`` is the last poll, for the router's ``/healthz``."""

    def __init__(self, export_dir: str, urls: list[str], *, timeout_s: float = 1.0, max_concurrency: int = 8):
        self.export_dir = os.path.abspath(export_dir)
        self.client = ShardClient(urls, timeout_s=timeout_s, max_concurrency=max_concurrency)
        self._health: list[dict] = [
            {"shard": i, "url": u, "versions": [], "error": "not polled yet"} for i, u in enumerate(self.client.urls)
        ]
        self._logged: str | None = None
        self._lock = threading.Lock()

    def _shard_problems(self, version: int, health: list[dict]) -> dict[int, str]:
        index_dir = layout.version_dir(self.export_dir, layout.INDEX, version)
        try:
            manifest = layout.read_json(os.path.join(index_dir, layout.INDEX_MANIFEST))
        except (OSError, ValueError) as exc:
            return {-1: f"cannot read {index_dir}/{layout.INDEX_MANIFEST}: {exc}"}
        entries = manifest.get("shards") or []
        if len(entries) != self.client.num_shards:
            return {-1: f"index/{version} has {len(entries)} shards, the router has {self.client.num_shards} URLs"}
        fingerprint = (manifest.get("model") or {}).get("fingerprint")
        problems = {}
        for shard, (h, entry) in enumerate(zip(health, entries, strict=True)):
            loaded = (h.get("loaded") or {}).get(str(version)) or {}
            if h.get("error"):
                problems[shard] = h["error"]
            elif version not in (h.get("versions") or []):
                problems[shard] = f"has versions {h.get('versions')}"
            elif loaded.get("ids_sha256") != entry.get("ids_sha256"):
                problems[shard] = f"its version {version} holds other ids than the sharded manifest records"
            elif loaded.get("fingerprint") != fingerprint:
                problems[shard] = f"its version {version} was built for another model than this export's"
        return problems

    def ready_versions(self, export_dir: str | None = None) -> list[int]:
        """Servable versions (ascending) that every shard server has loaded; logs why the newest one is not."""
        health = self.client.health()
        self._health = health
        local = layout.servable_versions(self.export_dir)
        on_every_shard = set(local)
        for h in health:
            on_every_shard &= set(h.get("versions") or [])
        ready = [v for v in sorted(on_every_shard) if not self._shard_problems(v, health)]
        if local and (not ready or local[-1] > ready[-1]):
            problems = self._shard_problems(local[-1], health)
            what = "; ".join(f"shard {s}: {r}" if s >= 0 else r for s, r in sorted(problems.items()))
            message = (
                f"version {local[-1]} is not loaded on every shard server ({what}); the router keeps its current "
                "version until it is"
            )
            with self._lock:
                if message != self._logged:  # once per change, not every poll
                    self._logged = message
                    log.warning("%s", message)
        return ready

    def load(self, export_dir: str, version: int) -> Searcher:
        """The :class:`Searcher` of ``version``: local text encoder, remote shards."""
        return remote_searcher(export_dir, version, self.client)

    def health_json(self) -> list[dict]:
        """Per shard, from the last poll: number, URL, loaded versions and sizes, error."""
        out = []
        for h in self._health:
            loaded = h.get("loaded") or {}
            out.append(
                {
                    "shard": h.get("shard"),
                    "url": h.get("url"),
                    "versions": h.get("versions") or [],
                    "sizes": {v: d.get("num_items") for v, d in loaded.items()},
                    "error": h.get("error"),
                }
            )
        return out

    def close(self) -> None:
        self.client.close()


def remote_searcher(export_dir: str, version: int, client: ShardClient, *, verify: bool = True) -> Searcher:
    """The local text encoder of ``version`` with the sharded index served by remote shard servers.

    ``client`` is a :class:`ShardClient` (URL i serving shard i); only the sharded index's manifest is read here,
    to check it against the model and the number of shard URLs."""

    def open_index(index_dir: str, meta: dict) -> RemoteShards:
        manifest = layout.read_json(os.path.join(index_dir, layout.INDEX_MANIFEST))
        check_compatible(manifest, meta, index_dir)
        return RemoteShards(client, version, manifest)

    return Searcher.with_index(export_dir, version, open_index, verify=verify)
