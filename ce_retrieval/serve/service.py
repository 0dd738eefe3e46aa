"""HTTP JSON retrieval service over an export (``ce-retrieval serve``), built on FastAPI + uvicorn.

    POST /search   {"texts": ["a dog on a beach"], "k": 10}          top-k images per text
                   {"texts": [...], "threshold": 0.62}               every image with cosine score >= 0.62
                   {"texts": [...], "precision": 0.9}                the guaranteed threshold for precision 0.9:
                                                                     precision >= 0.9 on new queries with the
                                                                     index's confidence 1 - delta; a level its
                                                                     calibration cannot certify is refused (422,
                                                                     "refused": true, with the reason);
                                                                     "guarantee": false serves the point estimate
                   {"texts": [...], "min_probability": 0.9}          every image with P(relevant | score) >= 0.9
                   optional "limit": cap on threshold hits per text (best first, "truncated": true if cut)
                   optional "exact": true: exact threshold search (default: the index's, approximate where its
                   build measured the set recall); every hit carries "probability" when the index has a map
    GET  /healthz  200 {"status": "ok", "version": v, ...} once a version is loaded, else 503
    GET  /metrics  Prometheus text: request counts, latency histogram, served version, reloads
    POST /admin/reload  look for a newer version now (the watcher also polls every ``reload_interval`` s)

Router mode (``shard_urls``, ``ce-retrieval serve --shard_urls ...``): the text encoder runs here and the index is
a set of shard servers (:mod:`ce_retrieval.serve.shard_server`) queried concurrently under a per-shard deadline
(:mod:`ce_retrieval.serve.router`); a response then carries ``"partial"`` and ``"shards"`` (which shards
answered), a partial answer is a 200 with the flag, and no answer from any shard is a 503. A version is served
only once every shard server has it loaded. An in-process sharded index (a sharded ``index/<v>``) gets the same
two fields, always complete.

Robustness: the body is read in chunks and refused past ``max_body_bytes`` (413); a declared Content-Type must
be JSON (415; none is read as JSON); the body must be UTF-8 (400) JSON (400) of the documented shape (422, with
the reason); each search runs in a worker thread under a deadline (504 when exceeded). The artefacts are loaded
once per version. When a newer complete version (encoders + index) appears, it is loaded in the background and
swapped in with one reference assignment:
requests already running keep the searcher they started with, new ones get the new one, none is dropped.
"""

import asyncio
import logging
import math
import os
import threading
import time
from typing import TYPE_CHECKING

from ce_retrieval.search import layout
from ce_retrieval.serve.http_app import (
    RequestError,
    check_media_type,
    error_response,
    install_error_shape,
    parse_object,
    read_body,
    reloading_lifespan,
    serve_in_thread,
)
from ce_retrieval.serve.metrics import Metrics
from ce_retrieval.serve.router import ShardRouter
from ce_retrieval.serve.searcher import PromiseRefused, Searcher
from ce_retrieval.serve.wire import ShardsUnavailableError

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger("ce_retrieval.serving")
# RequestError and serve_in_thread live in http_app.py (shared with the shard server); importable from here too
__all__ = ["RequestError", "SearcherHolder", "create_app", "serve_in_thread"]
SEARCH_FIELDS = {"texts", "k", "threshold", "precision", "min_probability", "limit", "exact", "guarantee"}
MODES = ("k", "threshold", "precision", "min_probability")


class SearcherHolder:
    """Holds the current :class:`Searcher`; ``reload()`` loads a newer version and swaps it in atomically.

    ``candidates(export_dir)`` lists the versions it may serve (ascending; default: every servable version; a
    router passes the versions that every shard server has loaded)."""

    def __init__(self, export_dir: str, metrics: Metrics, loader=None, candidates=None):
        self.export_dir = os.path.abspath(export_dir)
        self.metrics, self._loader = metrics, loader or Searcher.load
        self._candidates = candidates or layout.servable_versions
        self.searcher = None  # read without a lock: a reference read is atomic
        self._reload_lock = threading.Lock()
        self._failed: set[int] = set()
        self.last_error: str | None = None

    def reload(self) -> bool:
        """Loads the newest servable version if it is newer than the current one; True if swapped."""
        with self._reload_lock:
            candidates = [v for v in self._candidates(self.export_dir) if v not in self._failed]
            current = None if self.searcher is None else self.searcher.version
            if not candidates or (current is not None and candidates[-1] <= current):
                return False
            version = candidates[-1]
            try:
                new = self._loader(self.export_dir, version)
            except Exception as exc:  # keep serving the old version; do not retry a broken one forever
                self._failed.add(version)
                self.last_error = f"version {version}: {exc}"
                self.metrics.inc("ce_reload_failures_total")
                log.error("could not load version %s of %s: %s", version, self.export_dir, exc)
                return False
            self.searcher = new  # the atomic swap
            self.metrics.inc("ce_reloads_total")
            self.metrics.set("ce_served_version", version)
            self.metrics.set("ce_gallery_size", len(new.index))
            log.info("serving version %s (%d gallery items)", version, len(new.index))
            return True


def _parse_search(body: bytes, searcher, limits: dict) -> dict:
    req = parse_object(body, SEARCH_FIELDS)
    texts = req.get("texts")
    if not isinstance(texts, list) or not texts:
        raise RequestError(422, "'texts' must be a non-empty list of strings")
    if len(texts) > limits["max_texts"]:
        raise RequestError(422, f"too many texts: {len(texts)} > {limits['max_texts']}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise RequestError(422, f"texts[{i}] must be a string")
        if not t.strip():
            raise RequestError(422, f"texts[{i}] is empty")
        if len(t) > limits["max_text_chars"]:
            raise RequestError(422, f"texts[{i}] is longer than {limits['max_text_chars']} characters")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(422, f"texts[{i}] is not valid UTF-8 (lone surrogate escape)") from None
    modes = [m for m in MODES if req.get(m) is not None]
    if len(modes) > 1:
        raise RequestError(422, f"give only one of {', '.join(MODES)} (got {', '.join(modes)})")
    mode = modes[0] if modes else "k"
    value = req.get(mode, limits["default_k"])

    def number(name, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise RequestError(422, f"'{name}' must be a finite number")
        return v

    guarantee = req.get("guarantee", True)
    if not isinstance(guarantee, bool):
        raise RequestError(422, "'guarantee' must be true or false")
    if "guarantee" in req and mode != "precision":
        raise RequestError(422, "'guarantee' applies to precision queries")
    out = {"texts": texts, "limit": limits["max_results"], "exact": _exact_flag(req, mode), "guarantee": guarantee}
    out.update(dict.fromkeys(MODES))
    if mode == "k":
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(422, "'k' must be an integer")
        if not 1 <= value <= limits["max_k"]:
            raise RequestError(422, f"k out of range: {value} not in [1, {limits['max_k']}]")
        out["k"] = value
    elif mode == "threshold":
        value = float(number("threshold", value))
        if not -1.0 <= value <= 1.0:
            raise RequestError(422, f"threshold out of range: {value} not in [-1, 1] (cosine score)")
        out["threshold"] = value
    elif mode == "precision":
        value = float(number("precision", value))
        try:
            searcher.threshold_for_precision(value, guarantee)
        except PromiseRefused as exc:
            raise RequestError(422, str(exc), refused=True, precision=value) from None
        except ValueError as exc:
            raise RequestError(422, str(exc)) from None
        out["precision"] = value
    else:
        out["min_probability"] = _min_probability(float(number("min_probability", value)), searcher)
    if req.get("limit") is not None:
        lim = req["limit"]
        if isinstance(lim, bool) or not isinstance(lim, int) or not 1 <= lim <= limits["max_results"]:
            raise RequestError(422, f"'limit' must be an integer in [1, {limits['max_results']}]")
        out["limit"] = lim
    return out


def _exact_flag(req: dict, mode: str) -> bool:
    exact = req.get("exact", False)
    if not isinstance(exact, bool):
        raise RequestError(422, "'exact' must be true or false")
    if exact and mode == "k":
        raise RequestError(422, "'exact' applies to threshold queries (threshold, precision, min_probability)")
    return exact


def _min_probability(value: float, searcher) -> float:
    """A probability in (0, 1] that some score of the index's map reaches."""
    if not 0.0 < value <= 1.0:
        raise RequestError(422, f"min_probability out of range: {value} not in (0, 1]")
    try:
        searcher.threshold_for_probability(value)
    except ValueError as exc:
        raise RequestError(422, str(exc)) from None
    return value


def create_app(
    export_dir: str,
    *,
    max_texts: int = 64,
    max_k: int = 1000,
    max_results: int = 1000,
    max_text_chars: int = 2000,
    max_body_bytes: int = 1 << 20,
    timeout_s: float = 5.0,
    reload_interval_s: float = 10.0,
    max_concurrency: int = 8,
    default_k: int = 10,
    loader=None,
    shard_urls: list[str] | None = None,
    shard_timeout_s: float = 1.0,
) -> "FastAPI":
    """The FastAPI application; artefacts load at start-up and reload when a newer version appears.

    With ``shard_urls`` (shard server base URLs, URL i serving shard i) it is a router: the text encoder and the
    sharded index's manifest come from ``export_dir``, the searches go to the shard servers, each under a
    deadline of ``shard_timeout_s`` (which must be shorter than the request deadline ``timeout_s``)."""
    from fastapi import FastAPI

    metrics = Metrics()
    router, candidates = None, None
    if shard_urls:
        router = _shard_router(export_dir, shard_urls, shard_timeout_s, timeout_s, max_concurrency)
        loader, candidates = loader or router.load, router.ready_versions
        metrics.inc("ce_partial_responses_total", 0)
    holder = SearcherHolder(export_dir, metrics, loader, candidates)
    limits = {
        "max_texts": max_texts,
        "max_k": max_k,
        "max_results": max_results,
        "max_text_chars": max_text_chars,
        "default_k": default_k,
    }
    lifespan = reloading_lifespan(
        holder.reload, reload_interval_s, "ce-retrieval-reload", on_stop=None if router is None else router.close
    )

    app = FastAPI(title="ce_retrieval", version=__import__("ce_retrieval").__version__, lifespan=lifespan)
    app.state.holder, app.state.metrics, app.state.router = holder, metrics, router
    install_error_shape(app)
    _observe_requests(app, metrics)
    _add_search_route(
        app, holder, limits, max_body_bytes=max_body_bytes, timeout_s=timeout_s, gate_size=max_concurrency
    )
    _add_status_routes(app, holder, router)
    return app


def _shard_router(
    export_dir: str, shard_urls: list[str], shard_timeout_s: float, timeout_s: float, max_concurrency: int
) -> ShardRouter:
    """The router over ``shard_urls``; its per-shard deadline must fit inside the request deadline."""
    if not 0 < shard_timeout_s < timeout_s:
        raise ValueError(
            f"shard_timeout_s ({shard_timeout_s:g} s) must be positive and shorter than timeout_s ({timeout_s:g} s)"
        )
    return ShardRouter(export_dir, shard_urls, timeout_s=shard_timeout_s, max_concurrency=max_concurrency)


def _observe_requests(app, metrics: Metrics) -> None:
    """Middleware: in-flight gauge, and per request its path (known ones by name), status and latency."""
    from fastapi import Request

    @app.middleware("http")
    async def observe(request: Request, call_next):
        start = time.perf_counter()
        metrics.add("ce_in_flight_requests", 1)
        try:
            response = await call_next(request)
        finally:
            metrics.add("ce_in_flight_requests", -1)
        path = request.url.path if request.url.path in {"/search", "/healthz", "/metrics", "/admin/reload"} else "other"
        metrics.observe(path, response.status_code, time.perf_counter() - start)
        return response


def _add_search_route(
    app, holder: SearcherHolder, limits: dict, *, max_body_bytes: int, timeout_s: float, gate_size: int
) -> None:
    """``POST /search``: validate, run on the pinned searcher in a worker thread under ``timeout_s`` with at most
    ``gate_size`` searches at once, answer with :func:`_search_payload`."""
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    metrics, gate = holder.metrics, asyncio.Semaphore(gate_size)

    @app.post("/search")
    async def search(request: Request):
        searcher = holder.searcher  # pinned for this request: a concurrent reload does not affect it
        try:
            body = await read_body(request, max_body_bytes)
            if searcher is None:
                raise RequestError(503, "no servable version loaded yet")
            check_media_type(request)
            req = _parse_search(body, searcher, limits)
        except RequestError as exc:
            return error_response(exc.status, exc.reason, **exc.extra)
        start = time.perf_counter()

        async def run_search():
            async with gate:
                return await run_in_threadpool(
                    searcher.search,
                    req["texts"],
                    req["k"],
                    threshold=req["threshold"],
                    precision=req["precision"],
                    min_probability=req["min_probability"],
                    limit=req["limit"],
                    exact=req["exact"],
                    guarantee=req["guarantee"],
                )

        try:
            results = await asyncio.wait_for(run_search(), timeout_s)
        except asyncio.TimeoutError:
            metrics.inc("ce_search_timeouts_total")
            return error_response(504, f"search did not finish within {timeout_s:g} s")
        except ShardsUnavailableError as exc:  # not one shard answered: nothing to return, not even partially
            metrics.inc("ce_shard_unavailable_total")
            return error_response(503, str(exc), shards=exc.coverage.to_json())
        took_ms = round(1000 * (time.perf_counter() - start), 3)
        return JSONResponse(_search_payload(req, searcher, results, took_ms, metrics))


def _search_payload(req: dict, searcher, results: list, took_ms: float, metrics: Metrics) -> dict:
    """The ``/search`` answer: hits per text, the mode (k, or the threshold and the precision it came from) and,
    for a sharded index, which shards answered (``partial`` counted in the metrics)."""
    payload = {
        "version": searcher.version,
        "took_ms": took_ms,
        "results": [dict(text=t, **r.to_json(coverage=False)) for t, r in zip(req["texts"], results, strict=True)],
    }
    coverage = results[0].coverage if results else None  # one fan-out per request: the same for every text
    if coverage is not None:
        payload["partial"] = coverage.partial
        payload["shards"] = coverage.to_json()
        if coverage.partial:
            metrics.inc("ce_partial_responses_total")
    if req["k"] is not None:
        payload["k"] = req["k"]
        return payload
    if req["precision"] is not None:
        payload["threshold"], payload["precision"] = (
            searcher.threshold_for_precision(req["precision"], req["guarantee"]),
            req["precision"],
        )
        payload["guarantee"] = req["guarantee"]
        if req["guarantee"]:
            payload["confidence"] = searcher.guarantee["confidence"]
    elif req["min_probability"] is not None:
        payload["threshold"] = searcher.threshold_for_probability(req["min_probability"])
        payload["min_probability"] = req["min_probability"]
    else:
        payload["threshold"] = req["threshold"]
    payload["exact"] = req["exact"]
    return payload


def _health_body(holder: SearcherHolder, router: ShardRouter | None) -> tuple[dict, int]:
    """``/healthz``: the served version and its index (200), or ``loading`` and the last error (503); a router adds
    its shard servers' state."""
    s = holder.searcher
    shards = None if router is None else router.health_json()
    if s is None:
        body = {"status": "loading", "error": holder.last_error}
        if shards is not None:
            body["shards"] = shards
        return body, 503
    body = {
        "status": "ok",
        "version": s.version,
        "gallery_size": len(s.index),
        "index": s.index.manifest.get("kind") or "sharded",
        "embedding_dim": s.index.dim,
        "calibrated_precisions": s.offered_precisions,
        "guaranteed_precisions": {format(p, "g"): t for p, t in sorted(s.guaranteed_thresholds.items())},
        "confidence": None if s.guarantee is None else s.guarantee["confidence"],
        "last_error": holder.last_error,
    }
    num_shards = s.num_shards
    if num_shards is not None:
        body["num_shards"] = num_shards
    if shards is not None:
        body["mode"], body["shards"] = "router", shards
    return body, 200


def _add_status_routes(app, holder: SearcherHolder, router: ShardRouter | None) -> None:
    """``GET /healthz``, ``GET /metrics`` (Prometheus text) and ``POST /admin/reload``."""
    from fastapi.responses import JSONResponse, PlainTextResponse
    from starlette.concurrency import run_in_threadpool

    @app.get("/healthz")
    async def healthz():
        body, status = _health_body(holder, router)
        return body if status == 200 else JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(holder.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/admin/reload")
    async def reload():
        swapped = await run_in_threadpool(holder.reload)
        s = holder.searcher
        return {"reloaded": swapped, "version": None if s is None else s.version, "last_error": holder.last_error}
