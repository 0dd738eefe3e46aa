"""Searcher (top-k / threshold / calibrated precision vs brute force, CLI) and the HTTP service with a real
client on 127.0.0.1: valid and invalid requests, timeout, metrics, and a version reload under load."""

import json
import threading
import time

import httpx
import numpy as np
import pytest
from export_fixtures import THRESHOLDS, captions, make_towers, png_images

from ce_retrieval import cli
from ce_retrieval.build.export import embed_with_keras, export_encoders
from ce_retrieval.build.index import build_index
from ce_retrieval.serve.searcher import PromiseRefused, Searcher
from ce_retrieval.serve.service import create_app, serve_in_thread


def _brute(base_export, texts):
    q = embed_with_keras(base_export["text"], texts)
    g = embed_with_keras(base_export["image"], base_export["gallery"])
    return q @ g.T


def test_searcher_matches_brute_force(base_export, capsys):
    s = Searcher.load(base_export["dir"])
    texts = captions(5, seed=11)
    scores = _brute(base_export, texts)
    ids = base_export["ids"]
    for res, row in zip(s.search(texts, k=7), scores, strict=True):
        top = np.argsort(-row, kind="stable")[:7]
        assert res.ids.tolist() == ids[top].tolist()
        np.testing.assert_allclose(res.scores, row[top], atol=1e-5)
    for res, row in zip(s.search(texts, precision=0.8, guarantee=False), scores, strict=True):  # tau = 0.5, calibrated
        assert sorted(res.ids.tolist()) == sorted(ids[row >= THRESHOLDS["0.8"]].tolist())
        assert all(p is not None and p >= 0.8 for p in res.precision_levels)
    res = s.search(texts[:1], threshold=-1.0, limit=10)[0]
    assert res.truncated and len(res.ids) == 10 and np.all(np.diff(res.scores) <= 0)
    assert s.precision_levels(np.array([0.1, 0.3, 0.6, 0.9])) == [None, 0.5, 0.8, 0.9]
    with pytest.raises(ValueError, match="available: 0.5, 0.8, 0.9"):
        s.search(texts, precision=0.95, guarantee=False)
    with pytest.raises(PromiseRefused, match="no guaranteed thresholds"):  # built from bare thresholds
        s.search(texts, precision=0.8)
    with pytest.raises(ValueError, match="texts\\[1\\] is empty"):
        s.search(["ok", "  "], k=3)
    with pytest.raises(ValueError, match="exactly one"):
        s.search(texts, k=3, threshold=0.5)
    assert cli.main(["query", "--export_dir", base_export["dir"], "--text", texts[0], "--k", "3"]) == 0
    out = capsys.readouterr().out
    assert "export version 1, 300 gallery items" in out and f"id {ids[np.argmax(scores[0])]:>10}" in out


def _slow_loader(delay):
    def load(export_dir, version):
        s = Searcher.load(export_dir, version)
        fast = s.search
        s.search = lambda *a, **kw: (time.sleep(delay), fast(*a, **kw))[1]
        return s

    return load


def test_service_requests_and_validation(base_export):
    app = create_app(base_export["dir"], max_texts=4, max_k=50, max_body_bytes=2048, reload_interval_s=0)
    texts = captions(2, seed=4)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        health = c.get("/healthz").json()
        assert health["status"] == "ok" and health["version"] == 1 and health["gallery_size"] == 300
        r = c.post("/search", json={"texts": texts, "k": 3})
        assert r.status_code == 200, r.text
        body = r.json()
        scores = _brute(base_export, texts)
        for res, row in zip(body["results"], scores, strict=True):
            assert [h["id"] for h in res["hits"]] == base_export["ids"][np.argsort(-row, kind="stable")[:3]].tolist()
        r = c.post("/search", json={"texts": texts, "precision": 0.9, "guarantee": False})
        assert r.status_code == 200 and r.json()["threshold"] == THRESHOLDS["0.9"] and not r.json()["guarantee"]
        r = c.post("/search", json={"texts": texts, "precision": 0.9})  # an index without guaranteed thresholds
        assert r.status_code == 422 and r.json()["refused"] and "no guaranteed thresholds" in r.json()["error"]
        r = c.post("/search", json={"texts": ["Ünïcode 東京"], "threshold": 0.3, "limit": 5})
        assert r.status_code == 200 and r.json()["results"][0]["num_hits"] <= 5
        assert c.post("/search", json={"texts": texts}).json()["k"] == 10  # default mode: top 10

        bad = [
            (b'{"texts": ["a dog"], "k": 3', 400, "malformed JSON"),
            (b'{"texts": ["caf\xe9"], "k": 3}', 400, "not valid UTF-8"),
            (b'{"texts": ["\\ud800"], "k": 3}', 422, "lone surrogate"),
            (b'["a dog"]', 422, "JSON object"),
            (json.dumps({"texts": [], "k": 3}).encode(), 422, "non-empty list"),
            (json.dumps({"texts": ["ok", " "], "k": 3}).encode(), 422, "texts[1] is empty"),
            (json.dumps({"texts": ["a"] * 5, "k": 3}).encode(), 422, "too many texts"),
            (json.dumps({"texts": ["a"], "k": 0}).encode(), 422, "k out of range"),
            (json.dumps({"texts": ["a"], "k": 51}).encode(), 422, "k out of range"),
            (json.dumps({"texts": ["a"], "k": 2.5}).encode(), 422, "integer"),
            (json.dumps({"texts": ["a"], "threshold": 2}).encode(), 422, "threshold out of range"),
            (
                json.dumps({"texts": ["a"], "precision": 0.7, "guarantee": False}).encode(),
                422,
                "available: 0.5, 0.8, 0.9",
            ),
            (json.dumps({"texts": ["a"], "precision": 0.9, "guarantee": 1}).encode(), 422, "'guarantee' must be"),
            (json.dumps({"texts": ["a"], "k": 3, "guarantee": False}).encode(), 422, "applies to precision"),
            (json.dumps({"texts": ["a"], "k": 3, "threshold": 0.5}).encode(), 422, "only one"),
            (json.dumps({"texts": ["a"], "kk": 3}).encode(), 422, "unknown field"),
            (json.dumps({"texts": [3]}).encode(), 422, "must be a string"),
            (json.dumps({"texts": ["x" * 3000]}).encode(), 413, "exceeds the limit"),
        ]
        for payload, status, reason in bad:
            r = c.post("/search", content=payload, headers={"content-type": "application/json"})
            assert r.status_code == status and reason in r.json()["error"], (payload[:40], r.status_code, r.text)
        assert c.get("/search").status_code == 405
        metrics = c.get("/metrics").text
    assert 'ce_requests_total{path="/search",status="200"} 4' in metrics
    assert 'ce_requests_total{path="/search",status="422"} 16' in metrics
    assert 'ce_request_seconds_bucket{path="/search",le="+Inf"} 24' in metrics  # 4 + 19 + the 405
    assert "ce_served_version 1" in metrics and "ce_gallery_size 300" in metrics


def test_service_timeout(base_export):
    app = create_app(base_export["dir"], timeout_s=0.2, reload_interval_s=0, loader=_slow_loader(1.0))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/search", json={"texts": ["a dog"], "k": 2})
        assert r.status_code == 504 and "0.2 s" in r.json()["error"]
        assert "ce_search_timeouts_total 1" in c.get("/metrics").text


@pytest.mark.slow
def test_service_reloads_new_version_without_dropping_requests(base_export, export_copy):
    app = create_app(
        export_copy, reload_interval_s=0.2, timeout_s=120, loader=_slow_loader(0.05)
    )  # no 504 on a busy CI box
    statuses, versions, stop = [], set(), threading.Event()

    def client_loop(url):
        with httpx.Client(base_url=url, timeout=30) as c:
            while not stop.is_set():
                r = c.post("/search", json={"texts": ["a red car on the beach"], "k": 3})
                statuses.append(r.status_code)
                if r.status_code == 200:
                    versions.add(r.json()["version"])

    with serve_in_thread(app) as url:
        workers = [threading.Thread(target=client_loop, args=(url,)) for _ in range(3)]
        for w in workers:
            w.start()
        try:
            text, image = make_towers(seed=2)  # a retrained model: version 2 with its own index
            gallery = png_images(50, seed=6)
            paths = export_encoders(text, image, export_copy)
            build_index(embed_with_keras(image, gallery), np.arange(50), export_copy, paths.version)
            deadline = time.time() + 30
            while time.time() < deadline and httpx.get(url + "/healthz").json()["version"] != 2:
                time.sleep(0.1)
            time.sleep(0.5)  # keep the clients going on the new version for a moment
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=30)
        health = httpx.get(url + "/healthz").json()
    assert health["version"] == 2 and health["gallery_size"] == 50
    assert versions == {1, 2} and len(statuses) > 10
    assert set(statuses) == {200}, sorted(set(statuses))  # in-flight requests finished on the old searcher
