"""The HTTP service against the malformed-request corpus of ``benchmarks.serving.bad_requests`` (issue #15): every
request gets a 4xx with a reason, no 5xx, no hang, and the service still answers a valid search afterwards."""

import httpx
import pytest

from benchmarks.serving import bad_requests
from ce_retrieval.serve.service import create_app, serve_in_thread


@pytest.fixture(scope="module")
def outcomes(base_export):
    app = create_app(base_export["dir"], reload_interval_s=0)
    with serve_in_thread(app) as url:
        results = bad_requests.send_all(url, timeout=20)
        with httpx.Client(base_url=url, timeout=20) as c:
            health = c.get("/healthz")
            search = c.post("/search", json={"texts": ["a red dog"], "k": 3})
    return {"results": results, "health": health, "search": search}


def test_corpus_is_large_and_varied():
    cases = bad_requests.corpus()
    assert len(cases) >= 50
    assert {c.method for c in cases} >= {"GET", "POST", "PUT", "DELETE"}
    assert any(c.raw for c in cases) and any(len(c.body) > bad_requests.MAX_BODY_BYTES for c in cases)


def test_every_malformed_request_gets_a_4xx_with_a_reason(outcomes):
    bad = [(o.case.name, o.status, o.reason[:120]) for o in outcomes["results"] if not o.ok]
    assert not bad, bad


def test_service_still_up_after_the_corpus(outcomes):
    assert outcomes["health"].status_code == 200 and outcomes["health"].json()["status"] == "ok"
    assert outcomes["search"].status_code == 200 and len(outcomes["search"].json()["results"][0]["hits"]) == 3


def _by_name(outcomes, name):
    return next(o for o in outcomes["results"] if o.case.name == name)


@pytest.mark.parametrize(
    "name, status, words",
    [
        ("deeply nested arrays", 400, "nest"),  # was a 500 (RecursionError in json.loads)
        ("deep nesting at top level", 400, "nest"),
        ("huge integer literal k", 400, "integer"),  # was a 500 (int conversion limit: ValueError)
        ("GET /search", 405, "method"),  # FastAPI's own answers now use the service's {"error": reason} shape
        ("unknown path", 404, "not found"),
        ("body over the limit", 413, "limit"),
        ("content-length larger than the limit", 413, "limit"),
        ("chunked body over the limit", 413, "limit"),
        ("non-utf8 body", 400, "utf-8"),
        ("10,000 texts", 422, "too many texts"),
        ("k NaN", 422, "integer"),
        ("threshold NaN", 422, "finite"),
        ("valid JSON sent as a form", 415, "application/json"),  # was a 200: the media type was not checked
        ("valid JSON sent as text/plain", 415, "content-type"),
        ("xml body", 415, "application/xml"),
    ],
)
def test_reasons_name_the_problem(outcomes, name, status, words):
    o = _by_name(outcomes, name)
    assert o.status == status, (o.status, o.reason)
    assert words in o.reason.lower(), o.reason


def test_serve_binds_loopback_unless_told_otherwise():
    import argparse
    import inspect

    from ce_retrieval.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert parser.parse_args(["--export_dir", "x"]).host == "127.0.0.1"
    assert inspect.signature(serve_in_thread).parameters["host"].default == "127.0.0.1"
