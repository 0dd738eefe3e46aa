"""Guaranteed thresholds through the index, the Searcher, the HTTP service, `ce-retrieval query` and the sharded
index: derived for the served gallery's size, served by default, refused with the reason when not certified."""

import numpy as np
import pytest
from export_fixtures import GALLERY_SIZE

from ce_retrieval import cli
from ce_retrieval.build.export import embed_with_keras
from ce_retrieval.build.index import build_index
from ce_retrieval.build.sharded import build_sharded_index
from ce_retrieval.evaluation.guarantee import guaranteed_thresholds, rates_from_scores
from ce_retrieval.evaluation.probability import fit_scores
from ce_retrieval.evaluation.split_calibration import Calibration
from ce_retrieval.search import layout
from ce_retrieval.serve.searcher import PromiseRefused, Searcher

LEVELS = (0.5, 0.8, 0.9, 0.99)


@pytest.fixture(scope="module")
def calibration():
    """A calibration from a generated score model (labelled pairs of 600 captions x 300 images): at 300 items it
    certifies 0.5 / 0.8 / 0.9 and refuses 0.99."""
    rng = np.random.default_rng(0)
    units, images = 300, 300
    qids = np.repeat(np.arange(units), 2)
    s = rng.normal(0, 0.12, (len(qids), images))
    s[np.arange(len(qids)), qids] = 0.55 + rng.normal(0, 0.13, len(qids))
    rates = rates_from_scores(s, qids, np.arange(images))
    pmap = fit_scores(s, qids[:, None] == np.arange(images)[None, :])
    return Calibration(rates, pmap, LEVELS, 0.1, source={"test": "generated"})


def _gallery(base_export):
    return embed_with_keras(base_export["image"], base_export["gallery"]), base_export["ids"]


def test_index_derives_thresholds_for_its_own_size(export_copy, base_export, calibration):
    x, ids = _gallery(base_export)
    manifest = build_index(x, ids, export_copy, 1, overwrite=True, calibration=calibration)
    block = manifest["thresholds"]
    want = guaranteed_thresholds(calibration.rates, LEVELS, 0.1, GALLERY_SIZE)
    assert block["guaranteed"]["threshold_at_precision"] == want["threshold_at_precision"]
    assert block["threshold_at_precision"] == want["estimated"]["threshold_at_precision"]
    assert block["guaranteed"]["gallery_size"] == GALLERY_SIZE and block["guaranteed"]["delta"] == 0.1
    assert block["guaranteed"]["method"] and block["guaranteed"]["num_calibration_queries"] == 600
    assert block["calibration"]["source"] == {"test": "generated"}
    assert block["guaranteed"]["threshold_at_precision"]["0.99"] is None
    # the probability map is moved to this gallery's base rate (1 relevant in 300, the calibration's too here)
    assert block["probability"]["base_rate"]["served"] == pytest.approx(1 / 300)
    # the same calibration on a gallery 3x larger: higher thresholds, or refusals
    big = np.concatenate([x] * 3)
    bigger = build_index(big, np.arange(len(big)), export_copy, 1, overwrite=True, calibration=calibration)
    for level, tau in block["guaranteed"]["threshold_at_precision"].items():
        tau_big = bigger["thresholds"]["guaranteed"]["threshold_at_precision"][level]
        assert tau is None or tau_big is None or tau_big > tau
    assert bigger["thresholds"]["probability"]["base_rate"]["served"] == pytest.approx(1 / 900)
    with pytest.raises(ValueError, match="not both"):
        build_index(x, ids, export_copy, 1, overwrite=True, calibration=calibration, thresholds={"0.5": 0.3})


def test_searcher_serves_the_guarantee_and_refuses_what_it_cannot_certify(export_copy, base_export, calibration):
    x, ids = _gallery(base_export)
    build_index(x, ids, export_copy, 1, overwrite=True, calibration=calibration)
    s = Searcher.load(export_copy)
    guaranteed, estimated = s.guaranteed_thresholds[0.8], s.thresholds[0.8]
    assert guaranteed > estimated  # the guarantee costs recall
    texts = ["a red circle", "two blue squares"]
    scores = embed_with_keras(base_export["text"], texts) @ x.T
    for res, row in zip(s.search(texts, precision=0.8), scores, strict=True):
        assert sorted(res.ids.tolist()) == sorted(ids[row >= guaranteed].tolist())
    for res, row in zip(s.search(texts, precision=0.8, guarantee=False), scores, strict=True):
        assert sorted(res.ids.tolist()) == sorted(ids[row >= estimated].tolist())
    with pytest.raises(PromiseRefused, match="precision 0.99 is not guaranteed: .*cannot certify"):
        s.search(texts, precision=0.99)
    with pytest.raises(ValueError, match="available: 0.5, 0.8, 0.9, 0.99"):
        s.search(texts, precision=0.7)
    assert s.offered_precisions == [0.5, 0.8, 0.9, 0.99]


def test_service(export_copy, base_export, calibration):
    import httpx

    from ce_retrieval.serve.service import create_app, serve_in_thread

    x, ids = _gallery(base_export)
    manifest = build_index(x, ids, export_copy, 1, overwrite=True, calibration=calibration)
    taus = manifest["thresholds"]["guaranteed"]["threshold_at_precision"]
    app = create_app(export_copy, reload_interval_s=0)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        health = c.get("/healthz").json()
        assert health["confidence"] == 0.9 and health["guaranteed_precisions"]["0.99"] is None
        body = c.post("/search", json={"texts": ["a dog"], "precision": 0.9}).json()
        assert body["threshold"] == taus["0.9"] and body["guarantee"] and body["confidence"] == 0.9
        body = c.post("/search", json={"texts": ["a dog"], "precision": 0.9, "guarantee": False}).json()
        assert body["threshold"] == manifest["thresholds"]["threshold_at_precision"]["0.9"] and not body["guarantee"]
        r = c.post("/search", json={"texts": ["a dog"], "precision": 0.99})
        assert r.status_code == 422 and r.json()["refused"] and "cannot certify precision 0.99" in r.json()["error"]
        assert r.json()["precision"] == 0.99


def test_query_command(export_copy, base_export, calibration, capsys):
    x, ids = _gallery(base_export)
    build_index(x, ids, export_copy, 1, overwrite=True, calibration=calibration)
    assert cli.main(["query", "--export_dir", export_copy, "--text", "a dog", "--precision", "0.8"]) == 0
    assert "guaranteed for precision 0.8 with confidence 0.9" in capsys.readouterr().out
    assert cli.main(["query", "--export_dir", export_copy, "--text", "a dog", "--precision", "0.8", "--estimate"]) == 0
    assert "estimated for precision 0.8" in capsys.readouterr().out
    assert cli.main(["query", "--export_dir", export_copy, "--text", "a dog", "--precision", "0.99"]) == 2
    assert "cannot certify precision 0.99" in capsys.readouterr().out


def test_sharded_index_promises_for_the_whole_gallery(export_copy, base_export, calibration):
    x, ids = _gallery(base_export)
    manifest = build_sharded_index(
        x, ids, export_copy, 1, num_shards=3, workers=1, overwrite=True, calibration=calibration
    )
    assert manifest["thresholds"]["guaranteed"]["gallery_size"] == GALLERY_SIZE
    shard = layout.read_json(f"{export_copy}/index/1/{manifest['shards'][0]['name']}/manifest.json")
    assert shard["thresholds"]["guaranteed"]["gallery_size"] == manifest["shards"][0]["num_items"]
    s = Searcher.load(export_copy)
    assert s.num_shards == 3
    assert s.threshold_for_precision(0.8) == manifest["thresholds"]["guaranteed"]["threshold_at_precision"]["0.8"]
