"""What the retrieval service and the shard server share as HTTP apps, below both of them.

    RequestError          a request refused with a status and a reason (400, 409, 413, 415, 422, 503, ...)
    read_body             the body in chunks, 413 past a byte limit;  check_media_type  415 unless JSON
    parse_json / parse_object   UTF-8 JSON (400) holding one object with known fields only (422)
    error_response / install_error_shape   every error as ``{"error": reason, "status": status, ...}``
    reloading_lifespan    load at start-up, poll in a daemon thread, stop on shutdown
    serve_in_thread       uvicorn in a background thread (tests, the demo, the benchmarks)

FastAPI, Starlette and uvicorn are imported inside the functions that need them, so importing this module (and
the library) stays cheap for users who never serve.
"""

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse


class RequestError(Exception):
    """A request refused with an HTTP ``status`` and a ``reason``; ``extra`` fields join the error body."""

    def __init__(self, status: int, reason: str, **extra):
        super().__init__(reason)
        self.status, self.reason, self.extra = status, reason, extra


def _is_json_media_type(media_type: str) -> bool:
    """``application/json`` or a ``+json`` structured type; a request without a Content-Type is read as JSON."""
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


def check_media_type(request) -> None:
    """415 unless a declared Content-Type is JSON."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type and not _is_json_media_type(media_type):
        raise RequestError(415, f"Content-Type {media_type!r} is not supported; send application/json")


async def read_body(request, max_body_bytes: int) -> bytes:
    """The request body, read in chunks; 413 as soon as it (or its declared length) exceeds ``max_body_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise RequestError(413, f"request body of {declared} bytes exceeds the limit of {max_body_bytes}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise RequestError(413, f"request body exceeds the limit of {max_body_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(body: bytes) -> object:
    """Decodes a UTF-8 JSON body; 400 with the reason otherwise (never a 500, whatever the bytes)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:  # json's C scanner recurses per nesting level: [[[[...]]]] must not become a 500
        raise RequestError(400, "malformed JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal past Python's int conversion limit (4300 digits)
        raise RequestError(400, f"malformed JSON: {str(exc).split(';')[0]}") from None


def error_response(status: int, reason: str, **extra) -> "JSONResponse":
    """The service's error shape: ``{"error": reason, "status": status, ...extra}``."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": reason, "status": status, **extra}, status_code=status)


def install_error_shape(app) -> None:
    """FastAPI's own 404/405/... answers get the service's error shape, with the method and path as context."""
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        reason = f"{exc.detail}: {request.method} {request.url.path}"
        return JSONResponse({"error": reason, "status": exc.status_code}, exc.status_code, headers=exc.headers)


def parse_object(body: bytes, fields: set[str]) -> dict:
    """The body as a JSON object holding only ``fields`` (the service's and the shard server's request shape);
    ``RequestError`` 400 for malformed JSON, 422 for another shape or an unknown field."""
    req = parse_json(body)
    if not isinstance(req, dict):
        raise RequestError(422, "the body must be a JSON object")
    unknown = sorted(set(req) - fields)
    if unknown:
        raise RequestError(422, f"unknown field(s): {', '.join(unknown)}; allowed: {', '.join(sorted(fields))}")
    return req


def reloading_lifespan(reload, interval_s: float, thread_name: str, on_stop=None) -> Callable:
    """A FastAPI lifespan shared by the service and the shard server: ``reload()`` once at start-up, then every
    ``interval_s`` seconds in a daemon thread (0: never) until shutdown, then ``on_stop()``. A failing poll is
    ignored here: the holder records and logs it, and keeps serving what it has."""
    stop = threading.Event()

    def watch():
        while not stop.wait(interval_s):
            with contextlib.suppress(Exception):
                reload()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        from starlette.concurrency import run_in_threadpool

        await run_in_threadpool(reload)
        if interval_s > 0:
            threading.Thread(target=watch, name=thread_name, daemon=True).start()
        try:
            yield
        finally:
            stop.set()
            if on_stop is not None:
                on_stop()

    return lifespan


@contextlib.contextmanager
def serve_in_thread(
    app: "FastAPI", host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 60.0
) -> Iterator[str]:
    """Runs ``app`` with uvicorn in a background thread; yields the base URL; stops the server on exit."""
    import socket

    import uvicorn

    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="ce-retrieval-uvicorn", daemon=True)
    thread.start()
    deadline = time.time() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.time() > deadline:
            server.should_exit = True
            raise RuntimeError("the retrieval service did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
