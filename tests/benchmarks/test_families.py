"""The benchmark's dataset families: written in real formats, read back by the real loaders, ground truth kept."""

import io
import os

import numpy as np
import pytest
from PIL import Image

from benchmarks.quality.families.families import (
    FAMILIES,
    FamilySize,
    build_family,
    family_distractors,
    generate_family_split,
)
from benchmarks.quality.families.family_format import read_sidecar
from ce_retrieval.data import load_examples, load_retrieval_split

SIZE = FamilySize(num_train=12, num_val=6, num_test=8, captions_per_image=3, image_size=32, seed=3)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: (str(root / f), build_family(f, str(root / f), SIZE)) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_written_files_read_back_by_the_real_loader(written, family):
    out_dir, cfg = written[family]
    assert cfg.name == {"shapes": "tfrecord", "vague": "karpathy", "digits": "karpathy"}[family]
    for split in ("train", "val", "test"):
        expected = generate_family_split(family, split, SIZE)
        loaded = load_retrieval_split(cfg, split)
        order = np.argsort(loaded.image_ids)
        np.testing.assert_array_equal(loaded.image_ids[order], np.sort(expected.image_ids))
        by_id = dict(zip(expected.image_ids.tolist(), expected.images, strict=True))
        for image_id, image in zip(loaded.image_ids.tolist(), loaded.images, strict=True):
            assert image == by_id[image_id]
            assert Image.open(io.BytesIO(image)).size == (32, 32)
        want = sorted((c, int(i)) for i, caps in zip(expected.image_ids, expected.captions, strict=True) for c in caps)
        assert sorted(zip(loaded.captions, loaded.caption_ids.tolist(), strict=True)) == want
    train = generate_family_split(family, "train", SIZE)
    streamed = [(e["caption"].numpy().decode(), int(e["image_id"])) for e in load_examples(cfg, "train")]
    pairs = [(c, int(i)) for i, caps in zip(train.image_ids, train.captions, strict=True) for c in caps]
    assert sorted(streamed) == sorted(pairs)


@pytest.mark.parametrize("family", FAMILIES)
def test_sidecar_fits_contain_the_labelled_image_and_match_brute_force(written, family):
    out_dir, cfg = written[family]
    loaded = load_retrieval_split(cfg, "test")
    side = read_sidecar(out_dir, "test", loaded.image_ids)
    data = generate_family_split(family, "test", SIZE)
    for caption, caption_id in zip(loaded.captions, loaded.caption_ids.tolist(), strict=True):
        assert caption_id in side["fits"][caption]
    for caps, claims in zip(data.captions, data.claims, strict=True):  # claim ⊆ facts, checked pair by pair
        for caption, claim in zip(caps, claims, strict=True):
            brute = sorted(int(i) for i, facts in zip(data.image_ids, data.facts, strict=True) if claim <= facts)
            assert side["fits"][caption] == brute
    by_id = dict(zip(data.image_ids.tolist(), data.attributes, strict=True))
    np.testing.assert_array_equal(side["attributes"], np.stack([by_id[i] for i in loaded.image_ids.tolist()]))


def test_vague_captions_fit_more_images_than_the_shapes_captions():
    size = FamilySize(num_train=1, num_val=1, num_test=200, captions_per_image=5, image_size=32)
    mean_fits = {}
    for family in ("shapes", "vague"):
        fits = generate_family_split(family, "test", size).fits()
        mean_fits[family] = np.mean([len(v) for v in fits.values()])
    assert mean_fits["shapes"] < 1.5
    assert mean_fits["vague"] > 5 * mean_fits["shapes"]


def test_digit_captions_name_the_scene_digits():
    data = generate_family_split("digits", "val", SIZE)
    words = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    for caps, attributes in zip(data.captions, data.attributes, strict=True):
        present = set(np.flatnonzero(attributes[20:]).tolist())
        assert len(present) == 2
        for caption in caps:
            tokens = caption.replace("two digits, one of them", "").replace("two digits:", "").split()
            named = {d for d, w in enumerate(words) if w in tokens} | {int(t) for t in tokens if t.isdigit()}
            assert named and named <= present, caption


def test_build_family_reuses_an_identical_request_and_rewrites_a_different_one(tmp_path):
    small = FamilySize(num_train=3, num_val=2, num_test=2, captions_per_image=1, image_size=32)
    cfg = build_family("vague", str(tmp_path), small)
    marker = os.path.join(tmp_path, "family.json")
    stamp = os.stat(marker).st_mtime_ns
    assert build_family("vague", str(tmp_path), small) == cfg
    assert os.stat(marker).st_mtime_ns == stamp
    bigger = FamilySize(num_train=4, num_val=2, num_test=2, captions_per_image=1, image_size=32)
    assert len(load_retrieval_split(build_family("vague", str(tmp_path), bigger), "train").images) == 4


def test_unknown_family_and_unknown_sidecar_ids_are_errors(written, tmp_path):
    with pytest.raises(ValueError, match="unknown dataset family 'faces'"):
        build_family("faces", str(tmp_path))
    with pytest.raises(ValueError, match="not in the family's sidecar"):
        read_sidecar(written["digits"][0], "test", [123])


def test_distractors_are_decodable_images_of_the_requested_size():
    for family in FAMILIES:
        images = family_distractors(family, 2, image_size=32)
        assert [Image.open(io.BytesIO(b)).size for b in images] == [(32, 32)] * 2
