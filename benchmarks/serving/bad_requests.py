"""A corpus of malformed requests for the HTTP retrieval service, and a runner that sends it.

Shared by ``benchmarks/serving/reliability.py`` (the "bad requests" part) and
``tests/serve/test_service_malformed.py``, so the benchmark and the test check the same requests. It lives in
``benchmarks/`` rather than in the package: it is test data, not something a deployment needs.

Each case is a :class:`BadRequest`: method, path, headers, body bytes (or ``raw``: bytes written to the socket
as they are, for requests an HTTP client cannot produce), and the status class expected (``4xx``). A response
passes when its status is 4xx and its body carries a non-empty reason (``{"error": ...}`` for the service's own
answers; any non-empty body for protocol errors answered by the HTTP server itself).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
import urllib.parse

MAX_BODY_BYTES = 1 << 20  # the service's default --max_body_bytes; the corpus sizes its big bodies from this
MAX_TEXTS = 64
MAX_TEXT_CHARS = 2000
MAX_K = 1000


@dataclasses.dataclass(frozen=True)
class BadRequest:
    name: str
    body: bytes = b""
    method: str = "POST"
    path: str = "/search"
    content_type: str | None = "application/json"
    raw: bytes | None = None  # sent verbatim on a fresh socket instead of a normal request


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


def corpus(max_body_bytes: int = MAX_BODY_BYTES) -> list[BadRequest]:
    """The malformed requests (more than 50), each expected to get a 4xx with a reason."""
    ok = ["a dog on a beach"]
    deep = 100_000  # nesting far deeper than Python's recursion limit, well under the body limit
    cases = [
        # --- not JSON / not UTF-8
        BadRequest("empty body", b""),
        BadRequest("not json", b"hello"),
        BadRequest("truncated json", b'{"texts": ["a dog"'),
        BadRequest("trailing garbage", b'{"texts": ["a dog"]} xyz'),
        BadRequest("single quotes", b"{'texts': ['a dog']}"),
        BadRequest("non-utf8 body", b'{"texts": ["caf\xe9"]}'),
        BadRequest("utf-16 body", '{"texts": ["a dog"]}'.encode("utf-16")),
        BadRequest("binary garbage", bytes(range(256)) * 4),
        BadRequest("lone surrogate escape", b'{"texts": ["\\ud800 dog"]}'),
        BadRequest("deeply nested arrays", b'{"texts": ' + b"[" * deep + b"]" * deep + b"}"),
        BadRequest("deeply nested objects", b'{"texts": ' + b'{"a":' * deep + b"1" + b"}" * deep + b"}"),
        BadRequest("deep nesting at top level", b"[" * deep + b"]" * deep),
        BadRequest("huge integer literal k", b'{"texts": ["a dog"], "k": ' + b"9" * 5000 + b"}"),
        BadRequest("huge integer literal threshold", b'{"texts": ["a dog"], "threshold": ' + b"1" * 5000 + b"}"),
        # --- wrong top-level shape
        BadRequest("json null", b"null"),
        BadRequest("json list", _j([{"texts": ok}])),
        BadRequest("json string", _j("a dog")),
        BadRequest("json number", b"42"),
        BadRequest("empty object", b"{}"),
        # --- texts
        BadRequest("texts missing", _j({"k": 3})),
        BadRequest("texts null", _j({"texts": None})),
        BadRequest("texts is a string", _j({"texts": "a dog"})),
        BadRequest("texts is an object", _j({"texts": {"0": "a dog"}})),
        BadRequest("texts empty list", _j({"texts": []})),
        BadRequest("text is a number", _j({"texts": [3]})),
        BadRequest("text is null", _j({"texts": [None]})),
        BadRequest("text is a list", _j({"texts": [["a", "dog"]]})),
        BadRequest("text is a bool", _j({"texts": [True]})),
        BadRequest("empty text", _j({"texts": [""]})),
        BadRequest("whitespace text", _j({"texts": [" \t\n "]})),
        BadRequest("one good one empty text", _j({"texts": ["a dog", ""]})),
        BadRequest("text too long", _j({"texts": ["dog " * (MAX_TEXT_CHARS // 4 + 10)]})),
        BadRequest("huge text (~900 kB)", _j({"texts": ["x" * (max_body_bytes - 100_000)]})),
        BadRequest("10,000 texts", _j({"texts": ["a dog"] * 10_000})),
        BadRequest("max_texts + 1 texts", _j({"texts": ["a dog"] * (MAX_TEXTS + 1)})),
        # --- k
        BadRequest("k zero", _j({"texts": ok, "k": 0})),
        BadRequest("k negative", _j({"texts": ok, "k": -5})),
        BadRequest("k huge", _j({"texts": ok, "k": 10**12})),
        BadRequest("k above max_k", _j({"texts": ok, "k": MAX_K + 1})),
        BadRequest("k float", _j({"texts": ok, "k": 2.5})),
        BadRequest("k integral float", _j({"texts": ok, "k": 3.0})),
        BadRequest("k string", _j({"texts": ok, "k": "10"})),
        BadRequest("k bool", _j({"texts": ok, "k": True})),
        BadRequest("k list", _j({"texts": ok, "k": [10]})),
        BadRequest("k NaN", b'{"texts": ["a dog"], "k": NaN}'),
        BadRequest("k Infinity", b'{"texts": ["a dog"], "k": Infinity}'),
        BadRequest("k 1e400 (overflows to inf)", b'{"texts": ["a dog"], "k": 1e400}'),
        # --- threshold / precision / limit
        BadRequest("threshold NaN", b'{"texts": ["a dog"], "threshold": NaN}'),
        BadRequest("threshold -Infinity", b'{"texts": ["a dog"], "threshold": -Infinity}'),
        BadRequest("threshold above 1", _j({"texts": ok, "threshold": 1.5})),
        BadRequest("threshold below -1", _j({"texts": ok, "threshold": -1.01})),
        BadRequest("threshold huge", _j({"texts": ok, "threshold": 1e308})),
        BadRequest("threshold string", _j({"texts": ok, "threshold": "0.5"})),
        BadRequest("threshold bool", _j({"texts": ok, "threshold": False})),
        BadRequest("precision not calibrated", _j({"texts": ok, "precision": 0.77})),
        BadRequest("precision negative", _j({"texts": ok, "precision": -0.9})),
        BadRequest("precision NaN", b'{"texts": ["a dog"], "precision": NaN}'),
        BadRequest("precision string", _j({"texts": ok, "precision": "high"})),
        BadRequest("k and threshold", _j({"texts": ok, "k": 3, "threshold": 0.5})),
        BadRequest("threshold and precision", _j({"texts": ok, "threshold": 0.5, "precision": 0.9})),
        BadRequest("limit zero", _j({"texts": ok, "threshold": 0.5, "limit": 0})),
        BadRequest("limit negative", _j({"texts": ok, "threshold": 0.5, "limit": -1})),
        BadRequest("limit huge", _j({"texts": ok, "threshold": 0.5, "limit": 10**9})),
        BadRequest("limit float", _j({"texts": ok, "threshold": 0.5, "limit": 1.5})),
        # --- unknown fields
        BadRequest("unknown field", _j({"texts": ok, "k": 3, "top_k": 3})),
        BadRequest("misspelt texts", _j({"text": ok})),
        BadRequest("many unknown fields", _j({"texts": ok, **{f"f{i}": i for i in range(1000)}})),
        # --- size
        BadRequest("body over the limit", b'{"texts": ["' + b"a" * (max_body_bytes + 10) + b'"]}'),
        # --- methods, paths, content types
        BadRequest("GET /search", method="GET", content_type=None),
        BadRequest("PUT /search", _j({"texts": ok}), method="PUT"),
        BadRequest("DELETE /search", method="DELETE", content_type=None),
        BadRequest("PATCH /search", _j({"texts": ok}), method="PATCH"),
        BadRequest("POST /healthz", _j({"texts": ok}), path="/healthz"),
        BadRequest("GET /admin/reload", method="GET", path="/admin/reload", content_type=None),
        BadRequest("unknown path", _j({"texts": ok}), path="/serach"),
        BadRequest("path traversal", method="GET", path="/../../etc/passwd", content_type=None),
        BadRequest(
            "form-encoded body",
            urllib.parse.urlencode({"texts": "a dog"}).encode(),
            content_type=("application/x-www-form-urlencoded"),
        ),
        BadRequest(
            "multipart body",
            b'--xx\r\nContent-Disposition: form-data; name="texts"\r\n\r\na dog\r\n--xx--\r\n',
            content_type="multipart/form-data; boundary=xx",
        ),
        BadRequest("xml body", b"<search><texts>a dog</texts></search>", content_type="application/xml"),
        # valid JSON under a non-JSON media type (what `curl -d` sends): refused, not guessed at
        BadRequest("valid JSON sent as a form", _j({"texts": ok}), content_type="application/x-www-form-urlencoded"),
        BadRequest("valid JSON sent as text/plain", _j({"texts": ok}), content_type="text/plain"),
        # --- raw HTTP that a client library would not send
        BadRequest(
            "content-length larger than the limit",
            raw=(
                f"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {max_body_bytes * 1000}\r\n\r\n{{}}"
            ).encode(),
        ),
        BadRequest("garbage request line", raw=b"HELLO THERE\r\n\r\n"),
        BadRequest(
            "chunked body over the limit",
            raw=b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n"
            + b"".join(
                b"%x\r\n" % (64 * 1024) + b"a" * (64 * 1024) + b"\r\n" for _ in range(max_body_bytes // 65536 + 2)
            )
            + b"0\r\n\r\n",
        ),
        BadRequest(
            "header too large",
            raw=b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
        ),
    ]
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    return cases


@dataclasses.dataclass
class Outcome:
    case: BadRequest
    status: int | None
    reason: str
    seconds: float

    @property
    def ok(self) -> bool:
        """A 4xx with a non-empty reason."""
        return self.status is not None and 400 <= self.status < 500 and bool(self.reason.strip())


def _reason(body: bytes) -> str:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return body.decode("utf-8", "replace")[:200]
    if isinstance(payload, dict):
        return str(payload.get("error") or payload.get("detail") or "")[:200]
    return ""


def _send_raw(host: str, port: int, data: bytes, timeout: float) -> tuple[int | None, bytes]:
    """Writes ``data`` on a fresh connection and reads the status line and body of the answer."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading everything
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks):
                    head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
                    length = next(
                        (int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")),
                        None,
                    )
                    if length is not None and len(rest) >= length:
                        break
        except (ConnectionResetError, TimeoutError):
            pass
    data = b"".join(chunks)
    if not data.startswith(b"HTTP/"):
        return None, data
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def send(base_url: str, case: BadRequest, client=None, timeout: float = 30.0) -> Outcome:
    """Sends one case to the service at ``base_url`` (``http://host:port``) and records the answer."""
    import httpx

    start = time.perf_counter()
    parsed = urllib.parse.urlsplit(base_url)
    if case.raw is not None:
        try:
            status, body = _send_raw(parsed.hostname, parsed.port, case.raw, timeout)
        except OSError as exc:
            return Outcome(case, None, f"connection error: {exc}", time.perf_counter() - start)
        return Outcome(case, status, _reason(body), time.perf_counter() - start)
    headers = {} if case.content_type is None else {"Content-Type": case.content_type}
    own = client is None
    client = client or httpx.Client(base_url=base_url, timeout=timeout)
    try:
        r = client.request(case.method, case.path, content=case.body or None, headers=headers)
        return Outcome(case, r.status_code, _reason(r.content), time.perf_counter() - start)
    except httpx.HTTPError as exc:
        return Outcome(case, None, f"client error: {type(exc).__name__}: {exc}", time.perf_counter() - start)
    finally:
        if own:
            client.close()


def send_all(base_url: str, cases: list[BadRequest] | None = None, timeout: float = 30.0) -> list[Outcome]:
    """Sends every case (one at a time, one keep-alive connection for the normal ones)."""
    import httpx

    cases = corpus() if cases is None else cases
    with httpx.Client(base_url=base_url, timeout=timeout) as client:
        return [send(base_url, c, client, timeout) for c in cases]
