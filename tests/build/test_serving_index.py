"""Gallery index: ScaNN recall on a generated gallery, exact scores, exact threshold search vs brute force,
loading from another working directory, and refusal of an index that does not match the model."""

import json
import os
import shutil

import numpy as np
import pytest
from export_fixtures import clustered_unit_vectors

from ce_retrieval.build.index import BuildConfig, build_index
from ce_retrieval.search import layout
from ce_retrieval.search.exact import exact_search
from ce_retrieval.search.gallery import GalleryIndex, IndexMismatchError
from ce_retrieval.search.partitions import build_partitions, exact_threshold_search
from ce_retrieval.serve.searcher import Searcher


@pytest.fixture(scope="module")
def scann_gallery(tmp_path_factory, base_export):
    root = str(tmp_path_factory.mktemp("scann_export"))
    for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER):
        shutil.copytree(os.path.join(base_export["dir"], part), os.path.join(root, part))
    vectors = clustered_unit_vectors(4200, 16, seed=3)
    x, queries = vectors[:4000], vectors[4000:]
    ids = np.random.default_rng(0).permutation(10**6)[:4000].astype(np.int64)
    manifest = build_index(x, ids, root, 1, thresholds={0.9: 0.8}, config=BuildConfig(brute_force_below=1000))
    return {"dir": root, "x": x, "ids": ids, "queries": queries, "manifest": manifest}


def test_scann_index_recall_and_exact_scores(scann_gallery, tmp_path, monkeypatch):
    m = scann_gallery["manifest"]
    assert m["kind"] == "scann" and m["num_items"] == 4000
    assert m["params"]["num_leaves"] == 63 and 1 <= m["params"]["leaves_to_search"] < 63
    assert m["ann"]["recall_at_10"] >= 0.95 and m["ann"]["meets_target"]
    assert m["thresholds"]["threshold_at_precision"] == {"0.9": 0.8}
    monkeypatch.chdir(tmp_path)  # ScaNN assets are stored relative to their folder: load from elsewhere
    index = GalleryIndex.load(os.path.relpath(os.path.join(scann_gallery["dir"], "index", "1"), tmp_path))
    x, ids, q = scann_gallery["x"], scann_gallery["ids"], scann_gallery["queries"]
    got_ids, got_scores = index.topk(q, 10)
    exact_rows, exact_scores = exact_search(q, x, 10)
    recall = np.mean([len(np.intersect1d(a, ids[b])) for a, b in zip(got_ids, exact_rows, strict=True)]) / 10
    assert recall >= 0.9, recall  # held-out queries of the same distribution
    row_of = {int(i): r for r, i in enumerate(ids)}
    rescored = np.array([[q[b] @ x[row_of[int(i)]] for i in row] for b, row in enumerate(got_ids)])
    np.testing.assert_allclose(got_scores, rescored, atol=1e-5)  # re-ranked scores are exact dot products
    assert np.all(np.diff(got_scores, axis=1) <= 1e-7)
    e_ids, e_scores = index.topk(q, 10, exact=True)
    np.testing.assert_allclose(e_scores, exact_scores, atol=1e-5)
    big_ids, _ = index.topk(q[:2], 5000)
    assert big_ids.shape == (2, 4000)  # k larger than the gallery returns the gallery
    many_ids, many_scores = index.topk(q[:20], 1000, leaves_to_search=1)  # more than one leaf holds
    assert np.all(np.isfinite(many_scores)) and all(len(set(r.tolist())) == 1000 for r in many_ids)


@pytest.mark.parametrize("tau", [-1.0, 0.0, 0.55, 0.8, 0.95, 1.01])
def test_threshold_search_is_exact(scann_gallery, tau):
    index = GalleryIndex.load(os.path.join(scann_gallery["dir"], "index", "1"))
    x, ids, q = scann_gallery["x"], scann_gallery["ids"], scann_gallery["queries"]
    got_ids, got_scores = index.threshold(q, tau, exact=True)
    full = q @ x.T
    for b in range(len(q)):
        want = np.flatnonzero(full[b] >= tau)
        assert sorted(got_ids[b].tolist()) == sorted(ids[want].tolist())
        np.testing.assert_allclose(got_scores[b], np.sort(full[b, want])[::-1], atol=1e-5)


def test_ball_partitions_never_prune_a_hit(rng):
    x = clustered_unit_vectors(3000, 8, num_clusters=12, spread=0.2, seed=7)
    q = clustered_unit_vectors(64, 8, num_clusters=12, spread=0.2, seed=7)  # same centres: queries hit clusters
    order, parts = build_partitions(x, 50)
    xs = x[order]
    for tau in (0.3, 0.9, 0.97):
        rows, scores, scored = exact_threshold_search(q, xs, tau, parts, query_batch=16)
        brute_rows, _, _ = exact_threshold_search(q, xs, tau, None)
        assert [sorted(r.tolist()) for r in rows] == [sorted(r.tolist()) for r in brute_rows]
        if tau >= 0.9:
            assert scored < 0.8 * q.shape[0] * len(x)  # the bounds do skip leaves when tau is selective
    assert np.all(parts.radii >= 0) and parts.offsets[-1] == len(x)


def test_brute_force_index_below_size_threshold(base_export):
    index = GalleryIndex.load(os.path.join(base_export["dir"], "index", "1"))
    assert index.manifest["kind"] == "brute_force" and index.scann is None and index.partitions is None
    assert not os.path.exists(os.path.join(base_export["dir"], "index", "1", "scann"))


def test_mismatched_index_is_refused(export_copy):
    index_dir = os.path.join(export_copy, "index", "1")
    meta = layout.export_metadata(export_copy, layout.TEXT_ENCODER, 1)
    with pytest.raises(IndexMismatchError, match="dimension 16 != model's 32"):
        GalleryIndex.load(index_dir, expected_model=dict(meta, embedding_dim=32))
    # a version 2 whose encoders differ from the model the (copied) index was built with
    for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER, layout.INDEX):
        shutil.copytree(os.path.join(export_copy, part, "1"), os.path.join(export_copy, part, "2"))
    for part in (layout.TEXT_ENCODER, layout.IMAGE_ENCODER):
        path = os.path.join(export_copy, part, "2", layout.EXPORT_METADATA)
        layout.write_json(path, dict(layout.read_json(path), fingerprint="0" * 64, export_id="other"))
    assert layout.servable_versions(export_copy) == [1, 2]
    with pytest.raises(IndexMismatchError, match="fingerprint"):
        Searcher.load(export_copy, 2)
    # an index whose ids were changed after the manifest was written
    ids_path = os.path.join(index_dir, "ids.npy")
    np.save(ids_path, np.load(ids_path)[::-1].copy())
    with pytest.raises(IndexMismatchError, match="checksum"):
        Searcher.load(export_copy, 1)


def test_bad_gallery_input_is_rejected(export_copy):
    x = clustered_unit_vectors(10, 16)
    with pytest.raises(ValueError, match="dimension 8"):
        build_index(x[:, :8], np.arange(10), export_copy, 1, overwrite=True)
    with pytest.raises(ValueError, match="unique"):
        build_index(x, np.zeros(10), export_copy, 1, overwrite=True)
    with pytest.raises(ValueError, match="L2-normalised"):
        build_index(2 * x, np.arange(10), export_copy, 1, overwrite=True)
    with pytest.raises(FileExistsError, match="overwrite"):
        build_index(x, np.arange(10), export_copy, 1)
    manifest = build_index(x, np.arange(10), export_copy, 1, overwrite=True)  # atomic replacement
    assert (
        json.load(open(os.path.join(export_copy, "index", "1", "manifest.json")))["num_items"]
        == manifest["num_items"]
        == 10
    )
    assert sorted(os.listdir(os.path.join(export_copy, "index"))) == ["1"]


def test_index_cli_from_folder_and_tfrecord(base_export, export_copy, tmp_path, capsys):
    import tensorflow as tf
    from export_fixtures import png_images

    from ce_retrieval import cli
    from ce_retrieval.build.export import embed_with_keras

    images = png_images(12, seed=21)
    folder = tmp_path / "gallery"
    folder.mkdir()
    for i, b in enumerate(images):
        (folder / f"{100 + i}.png").write_bytes(b)
    report = tmp_path / "eval.json"
    report.write_text(json.dumps({"threshold_at_precision": {"0.5": 0.1, "0.9": 0.6}}))
    assert (
        cli.main(
            [
                "index",
                "--export_dir",
                export_copy,
                "--images",
                str(folder),
                "--overwrite",
                "--thresholds_json",
                str(report),
            ]
        )
        == 0
    )
    assert "index version 1: 12 items, brute_force" in capsys.readouterr().out
    index = GalleryIndex.load(os.path.join(export_copy, "index", "1"))
    assert sorted(index.ids.tolist()) == list(range(100, 112))
    assert index.manifest["thresholds"]["threshold_at_precision"] == {"0.5": 0.1, "0.9": 0.6}
    np.testing.assert_allclose(
        index.embeddings[np.argsort(index.ids)], embed_with_keras(base_export["image"], images), atol=1e-5
    )

    record = str(tmp_path / "gallery.tfrecord")
    with tf.io.TFRecordWriter(record) as w:  # one record per caption: image 7 appears twice
        for image_id, b in ((7, images[0]), (9, images[1]), (7, images[0])):
            feats = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b])),
                "image_id": tf.train.Feature(int64_list=tf.train.Int64List(value=[image_id])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
    assert cli.main(["index", "--export_dir", export_copy, "--images", record, "--overwrite"]) == 0
    assert sorted(GalleryIndex.load(os.path.join(export_copy, "index", "1")).ids.tolist()) == [7, 9]


def test_exact_top_k_of_an_index_breaks_ties_by_row():
    # The serving index had its own exact top-k (arbitrary among ties at the k-th score); it now uses the
    # evaluation's (ce_retrieval.search.exact): score descending, ties to the lower row, chunking-independent.
    x = np.repeat(np.eye(4, dtype=np.float32), 3, axis=0)  # rows 3i, 3i+1, 3i+2 are the same vector
    index = GalleryIndex("in-memory", {"params": {}}, x, np.arange(12, dtype=np.int64) * 10, None)
    rows, scores = index.topk_rows(np.eye(4, dtype=np.float32)[[2, 0]], 4, exact=True)
    assert rows.tolist() == [[6, 7, 8, 0], [0, 1, 2, 3]]
    np.testing.assert_array_equal(scores, [[1, 1, 1, 0], [1, 1, 1, 0]])
