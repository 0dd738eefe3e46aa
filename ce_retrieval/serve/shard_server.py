"""One shard of a sharded gallery index behind HTTP (``ce-retrieval serve-shard``), queried by a router.

A sharded index ``<export_dir>/index/<v>/`` (format ``ce_retrieval.sharded_index/1``) holds S ordinary index
folders ``shard-0000i-of-0000S/``. A shard server serves ONE shard number i: it loads that folder of the newest
servable versions and keeps the newest TWO loaded, so a router still on the previous version keeps getting
answers while it waits for every shard to have the new one (:mod:`ce_retrieval.serve.router`). A watcher
polls the export every ``reload_interval_s`` seconds like the service's; versions are swapped in and out with
one reference assignment, so a search that started on a version finishes on it.

    POST /shard/search  {"version": v, "queries": [[float, ...], ...], "k": k}
                        {"version": v, "queries_b64": "...", "threshold": t, "limit": L, "exact": true}
                        -> {"version": v, "shard": i, "results": [{"ids": [...], "scores": [...],
                                                                   "truncated": bool}, ...]}
    GET  /healthz       shard number, number of shards, loaded versions with their sizes and ids checksums
    GET  /metrics       Prometheus text;   POST /admin/reload   look for new versions now

Queries travel as JSON lists of floats or as ``queries_b64`` (float32 bytes); both are exact, and the format
is defined in :mod:`ce_retrieval.serve.wire` (``encode_queries`` is importable from here too).

Errors use the service's shape ``{"error": reason, "status": s}``: 400 (not UTF-8 / malformed JSON), 409
(that version is not loaded here; the body lists ``loaded``), 413 (body over ``max_body_bytes``), 415
(non-JSON Content-Type), 422 (wrong shape, dimension, non-finite value, k or limit out of range), 503 (nothing
loaded yet).
"""

import asyncio
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from ce_retrieval.search import layout
from ce_retrieval.search.assignment import shard_name, shard_of
from ce_retrieval.search.gallery import SHARDED_FORMAT, GalleryIndex, IndexMismatchError, check_compatible
from ce_retrieval.serve.http_app import (
    RequestError,
    check_media_type,
    error_response,
    install_error_shape,
    parse_object,
    read_body,
    reloading_lifespan,
)
from ce_retrieval.serve.metrics import Metrics
from ce_retrieval.serve.wire import (
    SEARCH_FIELDS,
    SEARCH_PATH,
    decode_queries_b64,
    decode_query_lists,
    encode_queries,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger("ce_retrieval.serving.shard")
__all__ = ["ShardHolder", "create_shard_app", "encode_queries", "load_shard", "parse_shard_search"]


def parse_shard_search(body: bytes, indexes: dict, shard: int, limits: dict) -> dict:
    """Validates a ``/shard/search`` body against the loaded ``indexes`` (version -> GalleryIndex); returns
    ``{"version", "index", "queries", "k", "threshold", "limit"}`` or raises ``RequestError``."""
    req = parse_object(body, SEARCH_FIELDS)
    version = req.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise RequestError(422, "'version' must be an integer (the index version to search)")
    if version not in indexes:
        loaded = sorted(indexes)
        raise RequestError(409, f"version {version} is not loaded on shard {shard}; loaded: {loaded}", loaded=loaded)
    index = indexes[version]
    if ("queries" in req) == ("queries_b64" in req):
        raise RequestError(422, "give exactly one of 'queries' (lists of floats) and 'queries_b64' (float32 bytes)")
    if "queries_b64" in req:
        queries = decode_queries_b64(req["queries_b64"], index.dim)
    else:
        queries = decode_query_lists(req["queries"], index.dim)
    if len(queries) > limits["max_queries"]:
        raise RequestError(422, f"too many queries: {len(queries)} > {limits['max_queries']}")
    finite = np.all(np.isfinite(queries), axis=1)
    if not finite.all():
        raise RequestError(422, f"queries[{int(np.argmin(finite))}] holds a non-finite value (or one past float32)")
    modes = [m for m in ("k", "threshold") if req.get(m) is not None]
    if len(modes) != 1:
        raise RequestError(422, "give exactly one of 'k' and 'threshold'")
    exact = req.get("exact", False)
    if not isinstance(exact, bool):
        raise RequestError(422, "'exact' must be true or false")
    out = {"version": version, "index": index, "queries": queries, "k": None, "threshold": None, "limit": None}
    out["exact"] = exact
    if modes[0] == "k":
        k = req["k"]
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= limits["max_k"]:
            raise RequestError(422, f"'k' must be an integer in [1, {limits['max_k']}]")
        out["k"] = k
        if req.get("limit") is not None or exact:
            raise RequestError(422, "'limit' and 'exact' apply to threshold searches only")
        return out
    t = req["threshold"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not -1.0 <= t <= 1.0:
        raise RequestError(422, "'threshold' must be a number in [-1, 1] (cosine score)")
    out["threshold"] = float(t)
    limit = req.get("limit", limits["max_results"])
    if limit is None:
        limit = limits["max_results"]
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= limits["max_results"]:
        raise RequestError(422, f"'limit' must be an integer in [1, {limits['max_results']}]")
    out["limit"] = limit
    return out


def load_shard(export_dir: str, version: int, shard: int) -> tuple[GalleryIndex, dict]:
    """Shard ``shard`` of the sharded ``index/<version>`` of an export, and the sharded index's manifest.

    Only that shard's folder is read. It must be bound to the exported model of that version (``GalleryIndex``'s
    checks) and agree with its entry in the sharded manifest (name, item count, ids checksum, every id assigned
    to this shard); otherwise ``IndexMismatchError``."""
    index_dir = layout.version_dir(export_dir, layout.INDEX, version)
    manifest = layout.read_json(os.path.join(index_dir, layout.INDEX_MANIFEST))
    if manifest.get("format") != SHARDED_FORMAT:
        raise IndexMismatchError(
            f"{index_dir} is not a sharded index (format {manifest.get('format')!r}); `ce-retrieval serve` serves it"
        )
    entries, num_shards = manifest.get("shards") or [], manifest.get("num_shards")
    if not isinstance(num_shards, int) or len(entries) != num_shards or not 0 <= shard < num_shards:
        raise IndexMismatchError(f"{index_dir} has {num_shards} shards: there is no shard {shard}")
    meta = layout.export_metadata(export_dir, layout.TEXT_ENCODER, version)
    check_compatible(manifest, meta, index_dir)
    entry, name = entries[shard], shard_name(shard, num_shards)
    if entry.get("name") != name:
        raise IndexMismatchError(f"{index_dir}: shard entry {shard} is named {entry.get('name')!r}, expected {name!r}")
    index = GalleryIndex.load(os.path.join(index_dir, name), expected_model=meta, mmap=True)
    problem = None
    if len(index) != entry.get("num_items"):
        problem = f"holds {len(index)} items, the sharded manifest says {entry.get('num_items')}"
    elif index.manifest["ids"]["sha256"] != entry.get("ids_sha256"):
        problem = "its ids do not match the sharded manifest's checksum"
    elif np.any(shard_of(index.ids, num_shards) != shard):
        problem = "holds ids that the assignment rule puts in other shards"
    if problem:
        raise IndexMismatchError(f"{index.path}: {problem}")
    return index, manifest


class ShardHolder:
    """The loaded versions of one shard: ``indexes`` maps version -> GalleryIndex (the newest ``keep``
    servable versions that load); ``reload()`` loads new ones, drops old ones and swaps the map atomically."""

    def __init__(self, export_dir: str, shard: int, metrics: Metrics, keep_versions: int = 2):
        if shard < 0:
            raise ValueError(f"shard must be >= 0, got {shard}")
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        self.export_dir, self.shard = os.path.abspath(export_dir), shard
        self.metrics, self.keep = metrics, keep_versions
        self.indexes: dict[int, GalleryIndex] = {}  # replaced, never mutated: readers need no lock
        self.num_shards: int | None = None
        self.last_error: str | None = None
        self._failed: set[int] = set()
        self._lock = threading.Lock()

    def _load(self, version: int):
        try:
            index, manifest = load_shard(self.export_dir, version, self.shard)
        except Exception as exc:  # keep serving what is loaded; do not retry a broken version forever
            self._failed.add(version)
            self.last_error = f"version {version}: {exc}"
            self.metrics.inc("ce_reload_failures_total")
            log.error("shard %d: could not load version %s of %s: %s", self.shard, version, self.export_dir, exc)
            return None
        self.num_shards = int(manifest["num_shards"])
        log.info("shard %d: loaded version %s (%d items)", self.shard, version, len(index))
        return index

    def reload(self) -> bool:
        """Loads the newest ``keep`` servable versions (newest first); True if the loaded set changed."""
        with self._lock:
            candidates = [v for v in layout.servable_versions(self.export_dir) if v not in self._failed]
            current = self.indexes
            new: dict[int, GalleryIndex] = {}
            for version in reversed(candidates):
                if len(new) == self.keep:
                    break
                index = current[version] if version in current else self._load(version)
                if index is not None:
                    new[version] = index
            if set(new) == set(current):
                return False
            self.indexes = dict(sorted(new.items()))  # the atomic swap
            self.metrics.inc("ce_reloads_total")
            self.metrics.set("ce_served_version", max(new, default=0))
            self.metrics.set("ce_loaded_versions", len(new))
            log.info("shard %d: versions loaded: %s", self.shard, sorted(new))
            return True

    def health(self) -> dict:
        indexes = self.indexes
        return {
            "status": "ok" if indexes else "loading",
            "shard": self.shard,
            "num_shards": self.num_shards,
            "versions": sorted(indexes),
            "loaded": {
                str(v): {
                    "num_items": len(ix),
                    "embedding_dim": ix.dim,
                    "kind": ix.manifest.get("kind"),
                    "ids_sha256": ix.manifest["ids"]["sha256"],
                    "fingerprint": ix.manifest["model"]["fingerprint"],
                }
                for v, ix in indexes.items()
            },
            "last_error": self.last_error,
        }


def _search(req: dict) -> list[dict]:
    index = req["index"]
    if req["k"] is not None:
        ids, scores = index.topk(req["queries"], req["k"])
        return [{"ids": i.tolist(), "scores": s.tolist(), "truncated": False} for i, s in zip(ids, scores, strict=True)]
    limit, out = req["limit"], []
    # exact: the shard's exact search; otherwise its default (approximate where its build measured the set recall)
    ids, scores, answers = index.answer_threshold(
        req["queries"], req["threshold"], exact=True if req["exact"] else None, limit=limit
    )
    for i, s, a in zip(ids, scores, answers, strict=True):
        cut = len(i) > limit
        out.append(
            {"ids": i[:limit].tolist(), "scores": s[:limit].tolist(), "truncated": bool(cut), "answer": a.to_json()}
        )
    return out


def create_shard_app(
    export_dir: str,
    shard: int,
    *,
    reload_interval_s: float = 10.0,
    keep_versions: int = 2,
    max_queries: int = 1024,
    max_k: int = 10_000,
    max_results: int = 100_000,
    max_body_bytes: int = 16 << 20,
    max_concurrency: int = 4,
) -> "FastAPI":
    """The FastAPI application of shard ``shard``; versions load at start-up and as they appear.

    (No ``from __future__ import annotations`` in this module: FastAPI must see the real ``Request`` class.)"""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse
    from starlette.concurrency import run_in_threadpool

    metrics = Metrics()
    holder = ShardHolder(export_dir, shard, metrics, keep_versions)
    limits = {"max_queries": max_queries, "max_k": max_k, "max_results": max_results}
    lifespan = reloading_lifespan(holder.reload, reload_interval_s, f"ce-retrieval-shard-{shard}-reload")

    version = __import__("ce_retrieval").__version__
    app = FastAPI(title=f"ce_retrieval shard {shard}", version=version, lifespan=lifespan)
    app.state.holder, app.state.metrics = holder, metrics
    gate = asyncio.Semaphore(max_concurrency)
    install_error_shape(app)

    @app.middleware("http")
    async def observe(request: Request, call_next):
        start = time.perf_counter()
        response = await call_next(request)
        known = {SEARCH_PATH, "/healthz", "/metrics", "/admin/reload"}
        path = request.url.path if request.url.path in known else "other"
        metrics.observe(path, response.status_code, time.perf_counter() - start)
        return response

    @app.post(SEARCH_PATH)
    async def search(request: Request):
        indexes = holder.indexes  # pinned for this request
        try:
            body = await read_body(request, max_body_bytes)
            if not indexes:
                raise RequestError(503, f"shard {shard}: no version loaded yet")
            check_media_type(request)
            req = parse_shard_search(body, indexes, shard, limits)
        except RequestError as exc:
            return error_response(exc.status, exc.reason, **exc.extra)
        start = time.perf_counter()
        async with gate:
            results = await run_in_threadpool(_search, req)
        took = round(1000 * (time.perf_counter() - start), 3)
        return JSONResponse({"version": req["version"], "shard": shard, "took_ms": took, "results": results})

    @app.get("/healthz")
    async def healthz():
        body = holder.health()
        return JSONResponse(body, status_code=200 if body["versions"] else 503)

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/admin/reload")
    async def reload():
        changed = await run_in_threadpool(holder.reload)
        return {"reloaded": changed, "versions": sorted(holder.indexes), "last_error": holder.last_error}

    return app
