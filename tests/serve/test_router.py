"""Router and shard servers (issue #14): a sharded index of the stand-in towers' export served by 3 shard server
PROCESSES (``ce-retrieval serve-shard``) behind an in-process router (``create_app(shard_urls=...)``), all on
127.0.0.1. The router's answers equal the single index's; a killed or slow shard gives a flagged partial answer
that is exact over the shards that answered; no shard gives a 503; a new version is served only once every shard
has it, without a failed request. The tests of this module share the shard processes and run in file order:
the hot reload publishes version 2, the last test kills the processes."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from export_fixtures import THRESHOLDS, captions, make_towers, png_images

from ce_retrieval.build.export import embed_with_keras, export_encoders
from ce_retrieval.build.sharded import build_sharded_index
from ce_retrieval.search import layout
from ce_retrieval.search.assignment import shard_name
from ce_retrieval.search.interface import SearchIndex
from ce_retrieval.search.sharded import ShardedIndex
from ce_retrieval.serve.searcher import Searcher
from ce_retrieval.serve.service import create_app, serve_in_thread
from ce_retrieval.serve.shard_server import create_shard_app, encode_queries

# every test here shares gallery or shard builds of several seconds: the full suite runs them, the fast tier does not
pytestmark = pytest.mark.slow

NUM_SHARDS = 3
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_shard(export_dir, shard, reload_interval, log_dir):
    port = _free_port()
    log = open(os.path.join(log_dir, f"shard-{shard}.log"), "wb")  # noqa: SIM115 (closed by the fixture)
    cmd = [sys.executable, "-m", "ce_retrieval.cli", "serve-shard", "--export_dir", export_dir]
    cmd += ["--shard", str(shard), "--port", str(port), "--reload_interval", str(reload_interval)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    return {"proc": proc, "url": f"http://127.0.0.1:{port}", "log": log}


def _wait_healthy(shards, timeout=150.0):
    deadline = time.time() + timeout
    pending = list(shards)
    while pending and time.time() < deadline:
        for s in list(pending):
            if s["proc"].poll() is not None:
                s["log"].flush()
                raise RuntimeError(f"shard server exited: {open(s['log'].name, 'rb').read()[-3000:].decode()}")
            try:
                if httpx.get(s["url"] + "/healthz", timeout=2).status_code == 200:
                    pending.remove(s)
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    if pending:
        raise RuntimeError(f"shard servers not up after {timeout:g} s: {[s['url'] for s in pending]}")


@pytest.fixture(scope="module")
def cluster(base_export, tmp_path_factory):
    """The base export with index/1 rebuilt as 3 brute-force shards, and 3 shard server processes over it
    (shard 2 does not poll for new versions: the hot-reload test tells it when)."""
    root = tmp_path_factory.mktemp("sharded")
    export_dir = str(root / "export")
    shutil.copytree(base_export["dir"], export_dir)
    shutil.rmtree(os.path.join(export_dir, "index", "1"))
    embeddings = embed_with_keras(base_export["image"], base_export["gallery"])
    build_sharded_index(
        embeddings, base_export["ids"], export_dir, 1, num_shards=NUM_SHARDS, workers=1, thresholds=THRESHOLDS
    )
    shards = [_start_shard(export_dir, i, 0.2 if i < 2 else 0, str(root)) for i in range(NUM_SHARDS)]
    try:
        _wait_healthy(shards)
        yield {"dir": export_dir, "shards": shards, "urls": [s["url"] for s in shards]}
    finally:
        for s in shards:
            if s["proc"].poll() is None:
                s["proc"].kill()
            s["proc"].wait(timeout=30)
            s["log"].close()


@pytest.fixture(scope="module")
def single(base_export):
    """The reference: the unsharded index of the same gallery."""
    return Searcher.load(base_export["dir"])


@pytest.fixture(scope="module")
def router(cluster):
    # Generous deadlines: on a busy 2-core CI worker a shard server loading a new version can stall for seconds, and
    # a missed deadline is a 503 that these tests would read as a dropped request (the deadline itself is tested
    # with a shard that answers late, below).
    app = create_app(
        cluster["dir"], shard_urls=cluster["urls"], shard_timeout_s=20.0, timeout_s=40, reload_interval_s=0.2
    )
    with serve_in_thread(app) as url:
        yield {"url": url, "app": app}


def _hits(result):
    return [h["id"] for h in result["hits"]], np.array([h["score"] for h in result["hits"]])


def _assert_same(response_results, expected):
    for got, want in zip(response_results, expected, strict=True):
        ids, scores = _hits(got)
        assert ids == want.ids.tolist()
        np.testing.assert_allclose(scores, want.scores, atol=1e-6)  # the service rounds scores to 6 decimals
        assert got["truncated"] == want.truncated


def test_float32_json_round_trip_is_exact():
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 1.17549435e-38, 3.4028235e38, -3.4028235e38, 1 / 3], np.float32)
    x = np.concatenate([special, rng.normal(size=5000).astype(np.float32), rng.random(1000).astype(np.float32) * 1e-40])
    back = np.asarray(json.loads(json.dumps(x.tolist())), dtype=np.float32)
    assert np.array_equal(back.view(np.uint32), x.view(np.uint32))


def test_router_matches_the_single_index(cluster, router, single):
    texts = captions(6, seed=3)
    with httpx.Client(base_url=router["url"], timeout=30) as c:
        health = c.get("/healthz").json()
        assert health["status"] == "ok" and health["mode"] == "router" and health["version"] == 1
        assert health["gallery_size"] == 300 and health["num_shards"] == NUM_SHARDS
        assert [s["versions"] for s in health["shards"]] == [[1]] * NUM_SHARDS
        for k in (1, 7, 1000):  # 1000 > the gallery: every item, merged in global order
            body = c.post("/search", json={"texts": texts, "k": k}).json()
            assert body["partial"] is False and body["k"] == k
            assert body["shards"] == {"answered": [0, 1, 2], "missing": {}, "total": 3}
            _assert_same(body["results"], single.search(texts, k=k))
        for query in ({"threshold": 0.3}, {"precision": 0.8, "guarantee": False}, {"threshold": -1.0, "limit": 10}):
            r = c.post("/search", json={"texts": texts, **query})
            assert r.status_code == 200 and r.json()["partial"] is False, r.text
            _assert_same(r.json()["results"], single.search(texts, **{"limit": 1000, **query}))
        assert c.post("/search", json={"texts": texts, "threshold": -1.0, "limit": 10}).json()["results"][0][
            "truncated"
        ]
        assert c.post("/search", json={"texts": ["a"], "k": 0}).status_code == 422  # validation as before
        assert "ce_partial_responses_total 0" in c.get("/metrics").text
    # the remote index alone: the GalleryIndex interface, strict (no partial answer can pass through it)
    remote = router["app"].state.holder.searcher.index
    q = single.embed(texts)
    ids, scores = remote.topk(q, 5)
    want_ids, want_scores = single.index.topk(q, 5)
    assert ids.tolist() == want_ids.tolist()
    np.testing.assert_allclose(scores, want_scores, atol=1e-6)
    got = remote.threshold(q, 0.4)
    want = single.index.threshold(q, 0.4)
    assert [a.tolist() for a in got[0]] == [a.tolist() for a in want[0]]
    # each shard server says how it answered; the router merges the flags (brute-force shards: exact)
    *_, answers = remote.search_threshold_answers(q, 0.4)
    assert [a.to_json() for a in answers] == [a.to_json() for a in single.index.answer_threshold(q, 0.4)[2]]
    assert all(a.exact for a in answers)
    # one interface for the remote shards and the local index: answer_threshold with a limit keeps the best
    # limit + 1 (so the cut shows), as the local index's answer does
    assert isinstance(remote, SearchIndex) and isinstance(single.index, SearchIndex)
    got_ids, got_scores, got_answers = remote.answer_threshold(q, -1.0, limit=10)
    want_ids, _, _ = single.index.answer_threshold(q, -1.0)
    assert [a.tolist() for a in got_ids] == [a[:11].tolist() for a in want_ids]
    assert len(got_answers) == len(q) and all(len(s) == 11 for s in got_scores)


def test_shard_server_protocol(cluster, single):
    from ce_retrieval.search.gallery import GalleryIndex

    url = cluster["urls"][0]
    q = single.embed(captions(4, seed=8))
    shard = GalleryIndex.load(os.path.join(cluster["dir"], "index", "1", shard_name(0, NUM_SHARDS)))
    with httpx.Client(base_url=url, timeout=30) as c:
        health = c.get("/healthz").json()
        assert health["shard"] == 0 and health["num_shards"] == NUM_SHARDS and health["versions"] == [1]
        assert health["loaded"]["1"]["num_items"] == len(shard)
        as_lists = c.post("/shard/search", json={"version": 1, "queries": q.tolist(), "k": 5}).json()
        as_b64 = c.post("/shard/search", json={"version": 1, "queries_b64": encode_queries(q), "k": 5}).json()
        assert as_lists["results"] == as_b64["results"] and as_b64["shard"] == 0 and as_b64["version"] == 1
        ids, scores = shard.topk(q, 5)
        assert [r["ids"] for r in as_b64["results"]] == ids.tolist()
        np.testing.assert_allclose([r["scores"] for r in as_b64["results"]], scores, atol=1e-6)
        r = c.post("/shard/search", json={"version": 1, "queries_b64": encode_queries(q), "threshold": -1, "limit": 3})
        assert all(len(x["ids"]) == 3 and x["truncated"] for x in r.json()["results"])
        r = c.post("/shard/search", json={"version": 1, "queries": q.tolist(), "threshold": -1, "exact": True})
        assert r.status_code == 200 and all(len(x["ids"]) > 3 for x in r.json()["results"])
        r = c.post("/shard/search", json={"version": 9, "queries": q.tolist(), "k": 5})
        assert r.status_code == 409 and r.json()["loaded"] == [1] and "not loaded" in r.json()["error"]
        nan = q.copy()
        nan[1, 3] = np.nan
        bad = [
            ({"version": 1, "queries": q[:, :5].tolist(), "k": 5}, "list of 16 numbers"),
            ({"version": 1, "queries": [[True] * 16], "k": 5}, "not a number"),
            ({"version": 1, "queries_b64": encode_queries(nan), "k": 5}, "queries[1] holds a non-finite"),
            ({"version": 1, "queries_b64": encode_queries(q)[:-4], "k": 5}, "multiple of 64"),
            ({"version": 1, "queries_b64": "@@@", "k": 5}, "base64"),
            ({"version": 1, "queries": q.tolist(), "k": 0}, "'k' must be an integer"),
            ({"version": 1, "queries": q.tolist(), "threshold": 2}, "'threshold' must be"),
            ({"version": 1, "queries": q.tolist()}, "exactly one of 'k' and 'threshold'"),
            ({"version": 1, "queries": q.tolist(), "queries_b64": "", "k": 1}, "exactly one of 'queries'"),
            ({"version": "1", "queries": q.tolist(), "k": 5}, "'version' must be an integer"),
            ({"version": 1, "queries": q.tolist(), "k": 5, "extra": 1}, "unknown field"),
            ({"version": 1, "queries": q.tolist(), "threshold": 0.5, "exact": "yes"}, "'exact' must be true or false"),
            ({"version": 1, "queries": q.tolist(), "k": 5, "exact": True}, "apply to threshold searches only"),
        ]
        for payload, reason in bad:
            r = c.post("/shard/search", json=payload)
            assert r.status_code == 422 and reason in r.json()["error"], (payload, r.text)
        r = c.post("/shard/search", content=b"{}", headers={"content-type": "text/plain"})
        assert r.status_code == 415
        assert c.post("/shard/search", content=b"{").status_code == 400
    small = create_shard_app(cluster["dir"], 0, reload_interval_s=0, max_body_bytes=2000, max_queries=8)
    with serve_in_thread(small) as url, httpx.Client(base_url=url, timeout=30) as c:
        many = np.repeat(q, 3, axis=0)  # 12 queries: 1 KiB as base64, 4 KiB as JSON lists
        assert c.post("/shard/search", json={"version": 1, "queries_b64": encode_queries(q), "k": 2}).status_code == 200
        r = c.post("/shard/search", json={"version": 1, "queries": many.tolist(), "k": 2})
        assert r.status_code == 413 and "limit of 2000" in r.json()["error"]
        r = c.post("/shard/search", json={"version": 1, "queries_b64": encode_queries(many), "k": 2})
        assert r.status_code == 422 and "too many queries: 12 > 8" in r.json()["error"]


def test_in_process_sharded_searcher_equals_the_single_index(cluster, single):
    sharded = Searcher.load(cluster["dir"], 1)
    assert sharded.num_shards == NUM_SHARDS and single.num_shards is None
    assert isinstance(sharded.index, ShardedIndex) and isinstance(sharded.index, SearchIndex)
    texts = captions(5, seed=21)
    for k in (3, 300):
        got = sharded.search(texts, k=k)
        for g, w in zip(got, single.search(texts, k=k), strict=True):
            assert g.ids.tolist() == w.ids.tolist()
            np.testing.assert_allclose(g.scores, w.scores, atol=1e-6)
    got = sharded.search(texts, precision=0.5, limit=20, guarantee=False)
    for g, w in zip(got, single.search(texts, precision=0.5, limit=20, guarantee=False), strict=True):
        assert g.ids.tolist() == w.ids.tolist() and g.truncated == w.truncated
    assert got[0].to_json()["partial"] is False and got[0].to_json()["shards_answered"] == [0, 1, 2]
    assert "partial" not in single.search(texts, k=2)[0].to_json()  # unsharded JSON unchanged
    app = create_app(cluster["dir"], reload_interval_s=0)  # the plain service over a sharded export, in-process
    with serve_in_thread(app) as url:
        body = httpx.post(url + "/search", json={"texts": texts, "k": 4}, timeout=30).json()
        health = httpx.get(url + "/healthz", timeout=30).json()
    assert body["partial"] is False and body["shards"] == {"answered": [0, 1, 2], "missing": {}, "total": 3}
    _assert_same(body["results"], single.search(texts, k=4))
    assert health["num_shards"] == NUM_SHARDS and health["index"] == "sharded" and "mode" not in health


def _expected_without(searcher, texts, k, lost_ids):
    """The exact top-k over the gallery without the items of the shards that did not answer."""
    out = []
    for res in searcher.search(texts, k=len(searcher.index)):
        keep = ~np.isin(res.ids, lost_ids)
        out.append((res.ids[keep][:k].tolist(), res.scores[keep][:k]))
    return out


def test_slow_shard_gives_a_partial_answer_within_the_deadline(cluster, single):
    slow = create_shard_app(cluster["dir"], 2, reload_interval_s=0)

    @slow.middleware("http")
    async def delay(request, call_next):  # a shard server that answers searches 3 s late
        import asyncio

        if request.url.path == "/shard/search":
            await asyncio.sleep(3.0)
        return await call_next(request)

    texts = captions(3, seed=5)
    with serve_in_thread(slow) as slow_url:
        urls = cluster["urls"][:2] + [slow_url]
        app = create_app(cluster["dir"], shard_urls=urls, shard_timeout_s=1.0, timeout_s=10, reload_interval_s=0)
        with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
            c.post("/search", json={"texts": texts, "k": 2})  # warm up (first search of this router)
            r = c.post("/search", json={"texts": texts, "k": 6})
            metrics = c.get("/metrics").text
    body = r.json()
    assert r.status_code == 200 and body["partial"] is True, r.text
    assert body["shards"]["answered"] == [0, 1] and list(body["shards"]["missing"]) == ["2"]
    # The 1 s shard deadline fired (not the 10 s request one): the slow shard is reported missing for a timeout
    # and the answer is partial. No wall-clock bound is asserted: on a busy machine it would be a flake.
    assert "timeout" in body["shards"]["missing"]["2"]
    lost = slow.state.holder.indexes[1].ids
    for got, (ids, scores) in zip(body["results"], _expected_without(single, texts, 6, lost), strict=True):
        assert _hits(got)[0] == ids
        np.testing.assert_allclose(_hits(got)[1], scores, atol=1e-6)
    assert "ce_partial_responses_total 2" in metrics  # the warm-up was partial too


def test_hot_reload_waits_for_every_shard_and_drops_nothing(cluster, router):
    url, shard_urls = router["url"], cluster["urls"]
    records, stop = [], threading.Event()

    def client_loop():
        with httpx.Client(base_url=url, timeout=30) as c:
            while not stop.is_set():
                sent = time.monotonic()
                r = c.post("/search", json={"texts": ["a red car on the beach"], "k": 3})
                body = r.json()
                records.append((sent, r.status_code, body.get("version"), body.get("partial")))

    def versions(shard):
        return httpx.get(shard_urls[shard] + "/healthz", timeout=10).json()["versions"]

    def wait_for(condition, what, timeout=60.0):
        deadline = time.time() + timeout
        while not condition():
            assert time.time() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    workers = [threading.Thread(target=client_loop) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        text, image = make_towers(seed=2)  # a retrained model: version 2, its own sharded index
        paths = export_encoders(text, image, cluster["dir"])
        gallery = embed_with_keras(image, png_images(60, seed=6))
        ids = np.arange(60, dtype=np.int64) + 5000
        build_sharded_index(gallery, ids, cluster["dir"], paths.version, num_shards=NUM_SHARDS, workers=1)
        assert paths.version == 2 and layout.servable_versions(cluster["dir"])[-1] == 2
        wait_for(lambda: versions(0) == [1, 2] and versions(1) == [1, 2], "shards 0 and 1 to load version 2")
        time.sleep(1.0)  # five router polls: shard 2 still lacks version 2, so the router stays on 1
        assert versions(2) == [1]
        assert httpx.get(url + "/healthz", timeout=10).json()["version"] == 1
        released = time.monotonic()
        assert httpx.post(shard_urls[2] + "/admin/reload", timeout=60).json()["versions"] == [1, 2]
        wait_for(lambda: httpx.get(url + "/healthz", timeout=10).json()["version"] == 2, "the router to serve 2")
        time.sleep(0.5)  # keep the clients going on the new version for a moment
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=30)
    health = httpx.get(url + "/healthz", timeout=10).json()
    assert health["version"] == 2 and health["gallery_size"] == 60
    assert {s for _, s, _, _ in records} == {200}, sorted({s for _, s, _, _ in records})
    assert {v for _, _, v, _ in records} == {1, 2} and not any(p for *_, p in records)
    assert all(sent >= released for sent, _, v, _ in records if v == 2)  # only after the last shard had it


def test_killed_shards_give_partial_answers_then_503(cluster, router):
    url = router["url"]
    version = httpx.get(url + "/healthz", timeout=10).json()["version"]
    sharded = Searcher.load(cluster["dir"], version)  # in-process reference over the same shards
    texts = captions(4, seed=13)
    victim = cluster["shards"][1]["proc"]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/search", json={"texts": texts, "k": 5})
        body = r.json()
        assert r.status_code == 200 and body["partial"] is True and body["version"] == version, r.text
        assert body["shards"]["answered"] == [0, 2] and "connection refused" in body["shards"]["missing"]["1"]
        lost = sharded.index.shards[1].ids
        for got, (ids, scores) in zip(body["results"], _expected_without(sharded, texts, 5, lost), strict=True):
            assert _hits(got)[0] == ids
            np.testing.assert_allclose(_hits(got)[1], scores, atol=1e-6)
        r = c.post("/search", json={"texts": texts, "threshold": 0.2})
        assert r.status_code == 200 and r.json()["partial"] is True
        for got, res in zip(r.json()["results"], sharded.search(texts, threshold=0.2), strict=True):
            assert _hits(got)[0] == res.ids[~np.isin(res.ids, lost)].tolist()  # the union over shards 0 and 2
        for s in (cluster["shards"][0], cluster["shards"][2]):
            os.kill(s["proc"].pid, signal.SIGKILL)
            s["proc"].wait(timeout=30)
        r = c.post("/search", json={"texts": texts, "k": 5})
        assert r.status_code == 503 and "no shard answered" in r.json()["error"], r.text
        assert r.json()["shards"]["answered"] == [] and len(r.json()["shards"]["missing"]) == NUM_SHARDS
        assert c.get("/healthz").json()["version"] == version  # still up, still on its version
        metrics = c.get("/metrics").text
    assert "ce_partial_responses_total 2" in metrics and "ce_shard_unavailable_total 1" in metrics


def test_cli_arguments():
    import argparse

    from ce_retrieval.cli import serve, serve_shard

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(["--export_dir", "x", "--shard_urls", "http://127.0.0.1:1, http://127.0.0.1:2"])
    assert args.shard_urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"] and args.shard_timeout_s == 1.0
    parser = argparse.ArgumentParser()
    serve_shard.add_arguments(parser)
    args = parser.parse_args(["--export_dir", "x", "--shard", "3"])
    assert args.host == "127.0.0.1" and args.shard == 3 and args.reload_interval == 10.0
    with pytest.raises(ValueError, match="shorter than timeout_s"):
        create_app("x", shard_urls=["http://127.0.0.1:1"], shard_timeout_s=5, timeout_s=5)
