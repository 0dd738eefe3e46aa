"""Batch gallery embedding on Apache Beam (ce_retrieval.build.pipeline, ``ce-retrieval embed-gallery``).

A small TFRecord gallery (30 images of the stand-in towers, two or three records per image id as with one record
per caption, one record of an undecodable image) runs through the pipeline on the DirectRunner; its shards must
hold exactly what the exported image signature gives, one row per valid id, in deterministic shards.
"""

import argparse
import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from export_fixtures import png_images

from ce_retrieval.build import pipeline as pl
from ce_retrieval.build.export import IMAGE_INPUT, load_signature
from ce_retrieval.data.tfrecords import serialize_example
from ce_retrieval.search import layout

NUM_IMAGES = 30
CORRUPT_ID = 9999
IDS = np.arange(NUM_IMAGES, dtype=np.int64) * 7 + 500


def _reference(export_dir, images):
    """Embeddings straight from the exported image signature, one call."""
    _, fn = load_signature(layout.version_dir(export_dir, layout.IMAGE_ENCODER, 1))
    return fn(**{IMAGE_INPUT: tf.constant(list(images), dtype=tf.string)})["embedding"].numpy()


def _hidden_leftovers(parent):
    return [n for n in os.listdir(parent) if n.startswith(".tmp-")]


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    """3 TFRecord files; image i has records in 2 or 3 of them; one extra record of id CORRUPT_ID is not an image.
    Id IDS[0] also has an earlier undecodable record: its first decodable record must be used."""
    root = tmp_path_factory.mktemp("beam_gallery")
    images = png_images(NUM_IMAGES, seed=11)
    paths = [str(root / f"gallery-{k:05d}-of-00003") for k in range(3)]
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    writers[0].write(serialize_example("a broken copy", b"\x89PNG truncated", IDS[0]))
    for i, (image, image_id) in enumerate(zip(images, IDS, strict=True)):
        for k in range(3):
            if k != i % 3 or i % 2 == 0:
                writers[k].write(serialize_example(f"caption {k} of image {i}", image, image_id))
    writers[1].write(serialize_example("not an image", b"this is not an image", CORRUPT_ID))
    for w in writers:
        w.close()
    return {"pattern": str(root / "gallery-*"), "images": images, "ids": IDS, "root": root}


@pytest.fixture(scope="module")
def skip_run(gallery, base_export, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("beam_out") / "embedded")
    manifest = pl.embed_gallery(gallery["pattern"], base_export["dir"], out, num_shards=4, batch_size=8)
    return {"dir": out, "manifest": manifest}


def test_embeddings_equal_the_exported_signature(gallery, base_export, skip_run):
    embeddings, ids, manifest = pl.load_embedded_gallery(skip_run["dir"])
    assert manifest == skip_run["manifest"]
    assert sorted(ids.tolist()) == sorted(gallery["ids"].tolist())
    expected = dict(zip(gallery["ids"].tolist(), _reference(base_export["dir"], gallery["images"]), strict=True))
    np.testing.assert_allclose(embeddings, np.stack([expected[i] for i in ids.tolist()]), atol=1e-6, rtol=0)
    assert embeddings.dtype == np.float32 and ids.dtype == np.int64
    meta = layout.export_metadata(base_export["dir"], layout.IMAGE_ENCODER, 1)
    assert manifest["format"] == pl.FORMAT
    assert manifest["export"]["export_id"] == meta["export_id"] and manifest["export"]["version"] == 1
    assert manifest["export"]["fingerprint"] == meta["fingerprint"]
    assert manifest["embedding_dim"] == embeddings.shape[1] == meta["embedding_dim"]
    assert manifest["count"] == NUM_IMAGES and manifest["runner"] == "DirectRunner"
    assert manifest["metrics"]["model_loads"] == 1  # one process, one load
    assert manifest["metrics"]["images_embedded"] == NUM_IMAGES
    assert manifest["elapsed_seconds"] > 0


def test_corrupt_record_is_skipped_counted_and_listed(skip_run):
    manifest = skip_run["manifest"]
    assert manifest["corrupt"]["count"] == 1 and manifest["metrics"]["corrupt_images"] == 1
    (item,) = manifest["corrupt"]["items"]
    assert item["id"] == CORRUPT_ID
    assert "gallery-00001-of-00003 record" in item["source"]
    assert "undecodable image" in item["reason"] and "0x" not in item["reason"]


def _python_splitmix64_shard(image_id, n):
    mask = (1 << 64) - 1
    x = (image_id + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return (x ^ (x >> 31)) % n


def test_shard_function_is_splitmix64_and_stable():
    ids = [0, 1, 2, 12345, -1, -7, 2**63 - 1, -(2**63), 10**15 + 3]
    assert [pl.shard_of(i, 8) for i in ids] == [_python_splitmix64_shard(i & ((1 << 64) - 1), 8) for i in ids]
    assert [pl.shard_of(i, 8) for i in (0, 1, 2, 12345, -1)] == [7, 1, 6, 0, 0]  # pinned: shards never move
    counts = np.bincount(pl.shard_of_ids(np.arange(20000), 8), minlength=8)
    assert counts.min() > 2200  # well mixed: consecutive ids spread evenly


def test_shards_are_complete_disjoint_sorted_and_deterministic(gallery, skip_run):
    manifest, out = skip_run["manifest"], skip_run["dir"]
    assert sorted(os.listdir(out)) == sorted(
        [pl.MANIFEST] + [name for s in range(4) for name in pl.shard_file_names(s, 4).values()]
    )
    seen = []
    for info in manifest["shards"]:
        ids = np.load(os.path.join(out, info["files"]["ids"]))
        embeddings = np.load(os.path.join(out, info["files"]["embeddings"]))
        assert len(ids) == info["count"] == len(embeddings)
        assert np.all(np.diff(ids) > 0)  # sorted by id, no duplicates
        assert all(pl.shard_of(i, 4) == info["shard"] for i in ids.tolist())
        with open(os.path.join(out, info["files"]["ids"]), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == info["sha256"]["ids"]
        seen.extend(ids.tolist())
    assert sorted(seen) == sorted(gallery["ids"].tolist())  # union = every valid id, each once


def test_two_threads_give_the_same_shards(gallery, base_export, skip_run, tmp_path):
    out = str(tmp_path / "threads")
    manifest = pl.embed_gallery(
        gallery["pattern"],
        base_export["dir"],
        out,
        num_shards=4,
        batch_size=5,
        pipeline_args=pl.direct_runner_args(2, "multi_threading"),
    )
    assert manifest["pipeline_args"][-1] == "multi_threading"
    emb_a, ids_a, _ = pl.load_embedded_gallery(skip_run["dir"])
    emb_b, ids_b, _ = pl.load_embedded_gallery(out)
    np.testing.assert_array_equal(ids_a, ids_b)
    np.testing.assert_allclose(emb_a, emb_b, atol=1e-6, rtol=0)
    first = skip_run["manifest"]["shards"]
    assert [s["count"] for s in manifest["shards"]] == [s["count"] for s in first]
    assert [s["sha256"]["ids"] for s in manifest["shards"]] == [s["sha256"]["ids"] for s in first]  # same id files


@pytest.mark.slow
def test_two_worker_processes(gallery, base_export, skip_run, tmp_path):
    """multi_processing: the DoFns are pickled into two fresh Python processes that each load the SavedModel."""
    out = str(tmp_path / "processes")
    manifest = pl.embed_gallery(
        gallery["pattern"], base_export["dir"], out, num_shards=4, batch_size=8, pipeline_args=pl.direct_runner_args(2)
    )
    emb_a, ids_a, _ = pl.load_embedded_gallery(skip_run["dir"])
    emb_b, ids_b, _ = pl.load_embedded_gallery(out)
    np.testing.assert_array_equal(ids_a, ids_b)
    np.testing.assert_allclose(emb_a, emb_b, atol=1e-6, rtol=0)
    assert manifest["corrupt"]["items"] == skip_run["manifest"]["corrupt"]["items"]
    assert 1 <= manifest["metrics"].get("model_loads", 1) <= 2  # once per worker process


def test_tampered_shard_is_detected(skip_run, tmp_path):
    out = str(tmp_path / "copy")
    shutil.copytree(skip_run["dir"], out)
    info = max(skip_run["manifest"]["shards"], key=lambda s: s["count"])
    path = os.path.join(out, info["files"]["embeddings"])
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(pl.GalleryIntegrityError, match=f"shard {info['shard']}: .*embeddings-.*SHA-256"):
        pl.load_embedded_gallery(out)
    embeddings, _, _ = pl.load_embedded_gallery(out, verify=False)  # the bytes are still a valid .npy
    assert embeddings.shape[0] == NUM_IMAGES
    os.unlink(os.path.join(out, info["files"]["ids"]))
    with pytest.raises(pl.GalleryIntegrityError, match=f"shard {info['shard']}: .*is missing"):
        pl.load_embedded_gallery(out, verify=False)


def test_repeated_ids_are_rejected(skip_run, tmp_path):
    out = str(tmp_path / "dupes")
    shutil.copytree(skip_run["dir"], out)
    manifest = json.loads(open(os.path.join(out, pl.MANIFEST)).read())
    a, b = [s for s in manifest["shards"] if s["count"]][:2]
    ids_a = np.load(os.path.join(out, a["files"]["ids"]))
    ids_b = np.load(os.path.join(out, b["files"]["ids"]))
    ids_b[0] = ids_a[0]  # an id of shard a also in shard b
    np.save(os.path.join(out, b["files"]["ids"]), ids_b)
    with open(os.path.join(out, b["files"]["ids"]), "rb") as f:
        b["sha256"]["ids"] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(out, pl.MANIFEST), "w") as f:
        json.dump(manifest, f)
    with pytest.raises(pl.GalleryIntegrityError, match=f"shard {b['shard']}: holds ids that belong to other shards"):
        pl.load_embedded_gallery(out)
    with pytest.raises(pl.GalleryIntegrityError, match=f"image ids repeat: \\[{ids_a[0]}\\]"):
        pl.load_embedded_gallery(out, verify=False)


def test_fail_policy_names_the_record_and_publishes_nothing(gallery, base_export, tmp_path):
    out = str(tmp_path / "failed")
    with pytest.raises(
        pl.CorruptImageError, match=f"id {CORRUPT_ID} in .*gallery-00001-of-00003 record .*undecodable"
    ) as e:
        pl.embed_gallery(gallery["pattern"], base_export["dir"], out, num_shards=2, on_corrupt="fail")
    assert str(e.value).endswith("(on_corrupt='skip' skips such images)")  # the runner's decorations are removed
    assert not os.path.exists(out)
    assert _hidden_leftovers(str(tmp_path)) == []  # the temporary folder is removed too


def test_existing_output_is_not_replaced_without_overwrite(gallery, base_export, skip_run):
    with pytest.raises(FileExistsError, match="already exists"):
        pl.embed_gallery(gallery["pattern"], base_export["dir"], skip_run["dir"])


def _image_folder(root, images, ids):
    os.makedirs(root)
    for image, image_id in zip(images, ids, strict=True):
        with open(os.path.join(root, f"{image_id}.png"), "wb") as f:
            f.write(image)
    with open(os.path.join(root, "13.jpg"), "wb") as f:
        f.write(b"\xff\xd8 not really a jpeg")
    with open(os.path.join(root, "notes.txt"), "w") as f:
        f.write("ignored: not an image suffix")
    return str(root)


def test_image_folder_source(base_export, tmp_path):
    images, ids = png_images(6, seed=21), [3, 5, 8, 21, 34, 55]
    folder = _image_folder(tmp_path / "images", images, ids)
    out = str(tmp_path / "embedded")
    manifest = pl.embed_gallery(folder, base_export["dir"], out, num_shards=3, batch_size=4)
    embeddings, got_ids, _ = pl.load_embedded_gallery(out)
    expected = dict(zip(ids, _reference(base_export["dir"], images), strict=True))
    assert sorted(got_ids.tolist()) == ids
    np.testing.assert_allclose(embeddings, np.stack([expected[i] for i in got_ids.tolist()]), atol=1e-6, rtol=0)
    assert manifest["source"]["kind"] == "folder" and manifest["source"]["files"] == 7
    (item,) = manifest["corrupt"]["items"]
    assert item["id"] == 13 and item["source"].endswith("13.jpg")


def test_karpathy_split_source_reads_files_in_the_pipeline(base_export, tmp_path):
    from ce_retrieval.data.config import DataConfig

    images = png_images(4, seed=31)
    root = tmp_path / "karpathy"
    os.makedirs(root)
    entries = []
    for i, image in enumerate(images):
        (root / f"img{i}.png").write_bytes(image)
        entries.append({"filename": f"img{i}.png", "split": "test", "imgid": 40 + i, "sentences": [{"raw": "a b"}]})
    entries.append({"filename": "other.png", "split": "train", "imgid": 1, "sentences": [{"raw": "c"}]})
    (root / "dataset.json").write_text(json.dumps({"images": entries}))
    cfg = DataConfig(name="karpathy", karpathy_json=str(root / "dataset.json"))
    out = str(tmp_path / "embedded")
    manifest = pl.embed_gallery("test", base_export["dir"], out, num_shards=2, data_config=cfg)
    embeddings, ids, _ = pl.load_embedded_gallery(out)
    expected = dict(zip(range(40, 44), _reference(base_export["dir"], images), strict=True))
    np.testing.assert_allclose(embeddings, np.stack([expected[i] for i in ids.tolist()]), atol=1e-6, rtol=0)
    assert manifest["source"]["kind"] == "split" and manifest["source"]["data_source"] == "karpathy"


def test_unknown_source_is_a_clear_error(base_export, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder, matches no"):
        pl.embed_gallery(str(tmp_path / "nothing-*"), base_export["dir"], str(tmp_path / "out"))
    with pytest.raises(ValueError, match="on_corrupt"):
        pl.embed_gallery("test", base_export["dir"], str(tmp_path / "out"), on_corrupt="ignore")


def test_cli_end_to_end(base_export, tmp_path, capsys):
    from ce_retrieval.cli import embed_gallery as cli

    folder = _image_folder(tmp_path / "images", png_images(5, seed=41), [1, 2, 3, 4, 5])
    out = str(tmp_path / "cli-out")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--export_dir", base_export["dir"], "--images", folder, "--output_dir", out, "--num_shards", "2"]
    args = parser.parse_args(argv + ["--batch_size", "4", "--", "--runner", "DirectRunner"])
    assert args.beam_args == ["--", "--runner", "DirectRunner"]
    assert cli.run(args) == 0
    line = capsys.readouterr().out.strip()
    assert "embedded 5 images" in line and "2 shards" in line and "1 corrupt" in line and "images/s" in line
    embeddings, ids, manifest = pl.load_embedded_gallery(out)
    assert sorted(ids.tolist()) == [1, 2, 3, 4, 5] and manifest["pipeline_args"] == ["--runner", "DirectRunner"]
    with pytest.raises(SystemExit, match="already exists"):
        cli.run(parser.parse_args(argv))
    with pytest.raises(SystemExit, match="id 13 in .*13.jpg"):
        cli.run(parser.parse_args(argv[:4] + ["--output_dir", str(tmp_path / "o2"), "--on_corrupt", "fail"]))
    two = parser.parse_args(argv + ["--workers", "2", "--", "--runner", "FlinkRunner"])
    with pytest.raises(SystemExit, match="--workers is for the DirectRunner"):
        cli.run(two)
