"""Karpathy JSON, Conceptual Captions TSV and TFRecord loaders on tiny fixtures, incl. corrupt rows."""

import io
import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from ce_retrieval.data import (
    DataConfig,
    DataError,
    SplitPaths,
    load_examples,
    load_report,
    load_retrieval_split,
    read_tfrecords,
    training_captions,
    write_tfrecords,
)
from ce_retrieval.data.sources import url_to_filename


def _image_bytes(color, fmt="PNG"):
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format=fmt)
    return buf.getvalue()


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


@pytest.fixture
def karpathy(tmp_path):
    root = tmp_path / "coco"
    _write(str(root / "train2014" / "a.jpg"), _image_bytes((255, 0, 0), "JPEG"))
    _write(str(root / "val2014" / "b.jpg"), _image_bytes((0, 255, 0), "JPEG"))
    _write(str(root / "val2014" / "c.png"), _image_bytes((0, 0, 255)))
    _write(str(root / "val2014" / "d.png"), _image_bytes((9, 9, 9)))
    _write(str(root / "val2014" / "broken.jpg"), b"\xff\xd8\xff not really a jpeg")

    def sents(*raws):
        return [{"raw": r, "tokens": str(r).split()} for r in raws]

    index = {
        "images": [
            {
                "filepath": "train2014",
                "filename": "a.jpg",
                "split": "train",
                "imgid": 10,
                "sentences": sents("a red square", "red block", "", "a crimson tile"),
            },
            {
                "filepath": "val2014",
                "filename": "b.jpg",
                "split": "restval",
                "imgid": 11,
                "sentences": sents("a green square", "green tile"),
            },
            {
                "filepath": "val2014",
                "filename": "c.png",
                "split": "test",
                "imgid": 12,
                "sentences": sents("a blue square", "blue tile", "navy block"),
            },
            {
                "filepath": "val2014",
                "filename": "d.png",
                "split": "val",
                "imgid": 13,
                "sentences": sents("dark square"),
            },
            {"filepath": "val2014", "filename": "missing.jpg", "split": "train", "imgid": 14, "sentences": sents("x")},
            {"filepath": "val2014", "filename": "broken.jpg", "split": "train", "imgid": 15, "sentences": sents("y")},
        ]
    }
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(index))
    return DataConfig(name="karpathy", karpathy_json=str(path), image_root=str(root))


def test_karpathy_train_folds_restval_and_skips_bad_rows(karpathy, caplog):
    with caplog.at_level(logging.WARNING, logger="ce_retrieval.data"):
        examples = list(load_examples(karpathy, "train").as_numpy_iterator())
    captions = [e["caption"].decode() for e in examples]
    assert captions == ["a red square", "red block", "a crimson tile", "a green square", "green tile"]
    assert [e["image_id"] for e in examples] == [10, 10, 10, 11, 11]
    assert Image.open(io.BytesIO(examples[0]["image"])).format == "JPEG"
    report = load_report(karpathy, "train")
    assert (report.bad_rows, report.missing_images, report.corrupt_images) == (1, 1, 1)
    assert (report.examples, report.images) == (5, 2)
    assert any("missing.jpg" in p for p in report.problems) and any("broken.jpg" in p for p in report.problems)
    assert "skipped 1 bad rows, 1 missing and 1 corrupt" in caplog.text
    assert training_captions(karpathy) == captions


def test_karpathy_restval_flag_and_test_split(karpathy):
    karpathy.restval_to_train = False
    assert {int(e["image_id"]) for e in load_examples(karpathy, "train").as_numpy_iterator()} == {10}
    split = load_retrieval_split(karpathy, "test")
    assert split.captions == ["a blue square", "blue tile", "navy block"]
    assert split.image_ids.tolist() == [12] and split.caption_ids.tolist() == [12, 12, 12]
    assert tf.io.decode_image(split.images[0]).shape == (8, 8, 3)


def test_karpathy_fail_mode_names_the_file(karpathy):
    karpathy.skip_corrupt = False
    with pytest.raises(DataError, match=r"sentences\[2\]: empty caption"):
        load_examples(karpathy, "train")
    data = json.loads(open(karpathy.karpathy_json).read())  # fix the caption: the missing file is next
    data["images"][0]["sentences"][2]["raw"] = "fixed"
    open(karpathy.karpathy_json, "w").write(json.dumps(data))
    with pytest.raises(DataError, match="missing image file .*missing.jpg"):
        load_examples(karpathy, "train")


@pytest.fixture
def cc_tsv(tmp_path):
    images = tmp_path / "images"
    _write(str(images / "one.jpg"), _image_bytes((200, 10, 10), "JPEG"))
    url = "http://example.com/pic?id=7"
    _write(str(images / (url_to_filename(url) + ".jpg")), _image_bytes((10, 200, 10), "JPEG"))
    _write(str(images / "bad.jpg"), b"garbage")
    rows = [
        b"caption\timage",
        b"a red photo\tone.jpg",
        ("a green photo from the web\t" + url).encode(),
        b"caption without image column",
        b"\tone.jpg",
        b"bad utf8 \xff\xfe\tone.jpg",
        b"the red photo again\tone.jpg\r",
        b"a broken file\tbad.jpg",
        b"a file that is not there\tnope.jpg",
        b"too\tmany\tcolumns",
    ]
    tsv = tmp_path / "val.tsv"
    tsv.write_bytes(b"\n".join(rows) + b"\n")
    return DataConfig(name="cc_tsv", tsv_path=SplitPaths(val=str(tsv)), tsv_image_root=str(images), tsv_header=True)


def test_cc_tsv_counts_and_skips(cc_tsv):
    examples = list(load_examples(cc_tsv, "val").as_numpy_iterator())
    assert [e["caption"].decode() for e in examples] == [
        "a red photo",
        "a green photo from the web",
        "the red photo again",
    ]
    assert [int(e["image_id"]) for e in examples] == [0, 1, 5]  # data-row indices
    report = load_report(cc_tsv, "val")
    assert report.rows == 9 and report.bad_rows == 4 and report.corrupt_images == 1 and report.missing_images == 1
    split = load_retrieval_split(cc_tsv, "val")
    assert len(split.images) == 3 and split.images[0] == split.images[2]


def test_cc_tsv_hash_ids_share_an_image(cc_tsv):
    cc_tsv.tsv_image_id = "hash"
    split = load_retrieval_split(cc_tsv, "val")
    assert len(split.captions) == 3 and len(split.images) == 2
    assert split.caption_ids[0] == split.caption_ids[2] != split.caption_ids[1]
    assert set(split.caption_ids.tolist()) == set(split.image_ids.tolist())


def test_cc_tsv_fail_mode_names_the_row(cc_tsv):
    cc_tsv.skip_corrupt = False
    with pytest.raises(DataError, match=r"val.tsv:4: expected 2 tab-separated columns"):
        load_examples(cc_tsv, "val")


def test_tfrecord_round_trip_with_shards(tmp_path):
    examples = [
        {"caption": f"caption {i}", "image": _image_bytes((i * 20, 0, 0)), "image_id": 100 + i // 2} for i in range(7)
    ]
    paths = write_tfrecords(examples, str(tmp_path / "tf" / "train"), num_shards=3)
    assert len(paths) == 3 and all(p.endswith("-of-00003") for p in paths)
    dataset, report = read_tfrecords(str(tmp_path / "tf" / "train-*"))
    got = sorted(dataset.as_numpy_iterator(), key=lambda e: e["caption"])
    assert [e["caption"].decode() for e in got] == [e["caption"] for e in examples]
    assert [e["image"] for e in got] == [e["image"] for e in examples]
    assert [int(e["image_id"]) for e in got] == [e["image_id"] for e in examples]
    assert (report.rows, report.examples, report.images, report.skipped) == (7, 7, 4, 0)
    cfg = DataConfig(name="tfrecord", tfrecord_pattern=SplitPaths(train=str(tmp_path / "tf" / "train-*")))
    split = load_retrieval_split(cfg, "train")
    assert split.image_ids.tolist() == [100, 101, 102, 103] and len(split.captions) == 7
    assert sorted(training_captions(cfg)) == sorted(e["caption"] for e in examples)


def test_tfrecord_corrupt_records_skip_or_fail(tmp_path):
    good = _image_bytes((1, 2, 3))
    rows = [
        {"caption": "ok one", "image": good, "image_id": 1},
        {"caption": "bad image", "image": b"not an image", "image_id": 2},
        {"caption": b"\xff\xfe", "image": good, "image_id": 3},
        {"caption": "ok two", "image": good, "image_id": 4},
    ]
    with pytest.raises(DataError, match="example 1"):
        write_tfrecords(rows, str(tmp_path / "strict"), num_shards=1)
    write_tfrecords(rows, str(tmp_path / "loose"), num_shards=1, validate=False)
    with open(tmp_path / "loose-00000-of-00001", "ab") as f:  # a record that is not a tf.train.Example
        writer_path = str(tmp_path / "junk")
        with tf.io.TFRecordWriter(writer_path) as w:
            w.write(b"\x08\x96\x01 junk")
        f.write(open(writer_path, "rb").read())
    cfg = DataConfig(name="tfrecord", tfrecord_pattern=SplitPaths(val=str(tmp_path / "loose-*")))
    got = list(load_examples(cfg, "val").as_numpy_iterator())
    assert [e["caption"] for e in got] == [b"ok one", b"ok two"]
    report = load_report(cfg, "val")
    assert (report.rows, report.corrupt_images, report.bad_rows) == (5, 1, 2)
    cfg.skip_corrupt = False
    with pytest.raises(DataError, match=r"loose-00000-of-00001 record 1: undecodable image"):
        load_examples(cfg, "val")
    assert np.array_equal(
        load_retrieval_split(
            DataConfig(name="tfrecord", tfrecord_pattern=SplitPaths(val=str(tmp_path / "loose-*"))), "val"
        ).image_ids,
        [1, 4],
    )
