"""Per-hit probabilities, the ``min_probability`` mode and the ``exact`` flag, in the Searcher and through HTTP,
with every bad value a 4xx naming the reason."""

import json
import os
import shutil

import httpx
import numpy as np
import pytest
from export_fixtures import THRESHOLDS, captions

from ce_retrieval.build.export import embed_with_keras
from ce_retrieval.build.index import build_index
from ce_retrieval.evaluation.probability import fit_scores
from ce_retrieval.search import layout
from ce_retrieval.serve.searcher import Searcher
from ce_retrieval.serve.service import create_app, serve_in_thread

# a hand-made map: P(relevant) 0 at score 0.1, 0.2 at 0.4, 0.8 at 0.7 (no score reaches 0.9)
MAP = fit_scores([0.1] * 4 + [0.4] * 5 + [0.7] * 5, [0] * 4 + [1, 0, 0, 0, 0] + [1, 1, 1, 1, 0])


@pytest.fixture(scope="module")
def prob_export(tmp_path_factory, base_export):
    root = str(tmp_path_factory.mktemp("prob_export"))
    for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER):
        shutil.copytree(os.path.join(base_export["dir"], part), os.path.join(root, part))
    gallery = embed_with_keras(base_export["image"], base_export["gallery"])
    build_index(gallery, base_export["ids"], root, 1, thresholds=THRESHOLDS, probability=MAP.to_json())
    return {"dir": root, "gallery": gallery, "ids": base_export["ids"], "text": base_export["text"]}


def test_min_score_inverts_the_map():
    for m in (0.05, 0.2, 0.5, 0.8):
        t = MAP.min_score(m)
        assert MAP(t) >= m and MAP(np.nextafter(t, -np.inf)) < m
    assert MAP.min_score(0.9) is None and MAP.min_score(0.0) == -1.0


def test_searcher_probabilities_and_min_probability(prob_export):
    s = Searcher.load(prob_export["dir"])
    texts = captions(4, seed=21)
    scores = embed_with_keras(prob_export["text"], texts) @ prob_export["gallery"].T
    for res in s.search(texts, k=5):
        np.testing.assert_allclose(res.probabilities, MAP(res.scores), atol=1e-6)
        assert [h["probability"] for h in res.to_json()["hits"]] == res.probabilities
    tau = MAP.min_score(0.5)
    for res, row in zip(s.search(texts, min_probability=0.5), scores, strict=True):
        assert sorted(res.ids.tolist()) == sorted(prob_export["ids"][row >= tau].tolist())
        assert all(p >= 0.5 for p in res.probabilities)
    exact = s.search(texts, threshold=0.3, exact=True)
    default = s.search(texts, threshold=0.3)  # a brute-force index: exact either way
    assert [r.ids.tolist() for r in exact] == [r.ids.tolist() for r in default]
    with pytest.raises(ValueError, match="highest is 0.8"):
        s.search(texts, min_probability=0.9)
    with pytest.raises(ValueError, match="threshold queries"):
        s.search(texts, k=3, exact=True)


def test_service_fields_modes_and_bad_values(prob_export, base_export):
    app = create_app(prob_export["dir"], reload_interval_s=0)
    texts = captions(2, seed=8)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        body = c.post("/search", json={"texts": texts, "k": 3}).json()
        hits = body["results"][0]["hits"]
        assert all(h["probability"] == pytest.approx(float(MAP(h["score"])), abs=1e-5) for h in hits)
        r = c.post("/search", json={"texts": texts, "min_probability": 0.5, "exact": True, "limit": 20})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["min_probability"] == 0.5 and out["exact"] is True
        assert out["threshold"] == pytest.approx(MAP.min_score(0.5))
        assert all(h["probability"] >= 0.5 for res in out["results"] for h in res["hits"])
        assert c.post("/search", json={"texts": texts, "threshold": 0.2}).json()["exact"] is False
        bad = [
            ({"min_probability": 0}, "min_probability out of range"),
            ({"min_probability": 1.5}, "min_probability out of range"),
            ({"min_probability": "high"}, "'min_probability' must be a finite number"),
            ({"min_probability": True}, "'min_probability' must be a finite number"),
            ({"min_probability": 0.9}, "no score reaches probability 0.9"),
            ({"min_probability": 0.5, "precision": 0.9}, "only one"),
            ({"threshold": 0.5, "exact": "yes"}, "'exact' must be true or false"),
            ({"threshold": 0.5, "exact": 1}, "'exact' must be true or false"),
            ({"k": 3, "exact": True}, "'exact' applies to threshold queries"),
        ]
        for fields, reason in bad:
            r = c.post("/search", content=json.dumps({"texts": ["a"], **fields}))
            assert r.status_code == 422 and reason in r.json()["error"], (fields, r.status_code, r.text)
    plain = create_app(base_export["dir"], reload_interval_s=0)  # an index without a probability map
    with serve_in_thread(plain) as url, httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/search", json={"texts": ["a"], "min_probability": 0.5})
        assert r.status_code == 422 and "no probability map" in r.json()["error"]
        hit = c.post("/search", json={"texts": ["a"], "k": 1}).json()["results"][0]["hits"][0]
        assert hit["probability"] is None


def test_query_command_min_probability(prob_export, capsys):
    from ce_retrieval import cli

    args = ["query", "--export_dir", prob_export["dir"], "--text", "a red circle", "--min_probability", "0.5"]
    assert cli.main(args + ["--exact", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert f"threshold {MAP.min_score(0.5):.4f}" in out and "P(relevant)" in out
