"""One gallery reader (build/gallery_source.py) for ``ce-retrieval index --images`` and the Beam pipeline:
folders, TFRecord patterns and splits read in-process, one entry per image id, corrupt images per policy."""

import json

import numpy as np
import pytest
from export_fixtures import png_images

from ce_retrieval.build import pipeline
from ce_retrieval.build.gallery_source import CorruptImageError, read_images, resolve_source
from ce_retrieval.data.config import DataConfig
from ce_retrieval.data.tfrecords import write_tfrecords


def test_folder_with_integer_names_reads_ids_from_the_names(tmp_path):
    images = png_images(3, seed=1)
    for i, image in zip([30, 4, 12], images, strict=True):
        (tmp_path / f"{i}.png").write_bytes(image)
    src = resolve_source(str(tmp_path))
    got, ids = read_images(src)
    assert ids.tolist() == [12, 30, 4]  # sorted by file name: "12.png" < "30.png" < "4.png"
    assert got == [images[2], images[0], images[1]] and ids.dtype == np.int64
    assert "names" not in src.info


def test_folder_with_other_names_numbers_the_sorted_listing(tmp_path):
    images = png_images(2, seed=2)
    (tmp_path / "b.jpg").write_bytes(images[0])
    (tmp_path / "a.png").write_bytes(images[1])
    src = resolve_source(str(tmp_path))
    got, ids = read_images(src)
    assert ids.tolist() == [0, 1] and got == [images[1], images[0]] and src.info["names"] == ["a.png", "b.jpg"]


def test_tfrecord_pattern_keeps_each_image_ids_first_record(tmp_path):
    images = png_images(3, seed=3)
    examples = [
        {"caption": "one", "image": images[0], "image_id": 7},
        {"caption": "two", "image": images[1], "image_id": 9},
        {"caption": "one again", "image": images[2], "image_id": 7},  # a later record of id 7: ignored
    ]
    write_tfrecords(examples, str(tmp_path / "gallery.tfrecord"))
    got, ids = read_images(resolve_source(str(tmp_path / "gallery.tfrecord*")))
    assert ids.tolist() == [7, 9] and got == [images[0], images[1]]


def test_karpathy_split_reads_the_listed_files(tmp_path):
    images = png_images(2, seed=4)
    entries = []
    for i, image in enumerate(images):
        (tmp_path / f"img{i}.png").write_bytes(image)
        entries.append({"filename": f"img{i}.png", "split": "test", "imgid": 40 + i, "sentences": [{"raw": "a b"}]})
    (tmp_path / "dataset.json").write_text(json.dumps({"images": entries}))
    cfg = DataConfig(name="karpathy", karpathy_json=str(tmp_path / "dataset.json"))
    got, ids = read_images(resolve_source("test", data_config=cfg))
    assert ids.tolist() == [40, 41] and got == images


def test_corrupt_images_are_skipped_or_refused_by_name(tmp_path):
    (tmp_path / "1.png").write_bytes(png_images(1, seed=5)[0])
    (tmp_path / "2.png").write_bytes(b"\x89PNG not really")
    src = resolve_source(str(tmp_path))
    assert read_images(src)[1].tolist() == [1, 2]  # unchecked: the encoder meets the bytes
    assert read_images(src, "skip")[1].tolist() == [1]
    with pytest.raises(CorruptImageError, match=r"id 2 in .*2\.png"):
        read_images(src, "fail")


def test_the_pipeline_uses_the_same_reader():
    assert pipeline.resolve_source is resolve_source and pipeline.CorruptImageError is CorruptImageError
