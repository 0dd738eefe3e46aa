"""The synthetic image-caption set: determinism, splits, captions that describe the pixels, hardness."""

import io
import re
from collections import defaultdict

import numpy as np
import pytest
from PIL import Image

from ce_retrieval.data import synthetic
from ce_retrieval.data.synthetic import COLORS, RELATIONS, SHAPES

N = 240


@pytest.fixture(scope="module")
def train():
    return synthetic.generate_split("train", N, seed=7)


def _decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


COLOR_WORD = {w: c for c, (_, words) in COLORS.items() for w in words}
SHAPE_WORD = {w: s for s, pairs in SHAPES.items() for pair in pairs for w in pair if " " not in w}
SHAPE_WORD.update({"plus": "cross"})
RELATION_PATTERNS = sorted(((p, r) for r, ps in RELATIONS.items() for p in ps), key=lambda x: -len(x[0]))


def _mentions(caption):
    """(colour, shape) per noun phrase in order of mention, from the lexicon alone."""
    tokens = re.findall(r"[a-z]+", caption)
    out, colour, shape = [], None, None
    for tok in tokens:
        if tok in COLOR_WORD:
            colour = COLOR_WORD[tok]
        elif tok in SHAPE_WORD:
            shape = SHAPE_WORD[tok]
        else:
            continue
        if colour is not None and shape is not None:  # "red circles" or "circles, small and red"
            out.append((colour, shape))
            colour, shape = None, None
    return out


def test_same_seed_same_bytes_and_other_seed_differs():
    a = synthetic.generate_split("val", 12, seed=3, image_size=32)
    b = synthetic.generate_split("val", 12, seed=3, image_size=32)
    c = synthetic.generate_split("val", 12, seed=4, image_size=32)
    assert a.images == b.images and a.captions == b.captions
    assert np.array_equal(a.image_ids, b.image_ids)
    assert a.images != c.images and a.captions != c.captions
    assert _decode(a.images[0]).shape == (32, 32, 3)


def test_splits_are_disjoint():
    splits = {s: synthetic.generate_split(s, 40, seed=1) for s in ("train", "val", "test")}
    ids = [set(s.image_ids.tolist()) for s in splits.values()]
    images = [set(s.images) for s in splits.values()]
    for i in range(3):
        assert len(images[i]) == 40  # no two identical images within a split
        for j in range(i + 1, 3):
            assert not ids[i] & ids[j]
            assert not images[i] & images[j]


def test_several_distinct_captions_per_image(train):
    assert all(len(c) == 5 for c in train.captions)
    distinct = np.mean([len(set(c)) for c in train.captions])
    assert distinct > 4.5
    captions, caption_ids, index = train.flat_captions()
    assert len(captions) == 5 * N and np.array_equal(caption_ids, train.image_ids[index])


def test_captions_name_exactly_the_drawn_colours_and_shapes(train):
    for scene, caps in zip(train.scenes, train.captions, strict=True):
        groups = {(g.color, g.shape) for g in scene.groups}
        for caption in caps:
            assert set(_mentions(caption)) == groups, (caption, scene)
            counts = {g.count for g in scene.groups}
            words = set(caption.split())
            if words & {"two", "pair"}:
                assert 2 in counts, (caption, scene)
            if words & {"three", "trio"}:
                assert 3 in counts, (caption, scene)


def test_relation_words_match_the_geometry(train):
    checked = 0
    for scene, objects, caps in zip(train.scenes, train.objects, train.captions, strict=True):
        if scene.relation is None:
            continue
        centers = [np.array([o.center for o in objects if o.group == g]) for g in (0, 1)]
        for caption in caps:
            first = _mentions(caption)[0]
            g = 0 if first == (scene.groups[0].color, scene.groups[0].shape) else 1
            relation = next(r for p, r in RELATION_PATTERNS if f" {p} " in f" {caption} ")
            a, b = centers[g], centers[1 - g]
            if relation == "above":
                assert a[:, 1].max() < b[:, 1].min(), caption
            elif relation == "below":
                assert a[:, 1].min() > b[:, 1].max(), caption
            elif relation == "left":
                assert a[:, 0].max() < b[:, 0].min(), caption
            else:
                assert a[:, 0].min() > b[:, 0].max(), caption
            checked += 1
    assert checked > 2 * N


def test_pixels_at_object_centres_have_the_named_colour(train):
    palette = np.array([rgb for rgb, _ in COLORS.values()], np.float32)
    names = list(COLORS)
    for png, scene, objects in zip(train.images[:60], train.scenes, train.objects, strict=False):
        pixels = _decode(png).astype(np.float32)
        assert len(objects) == sum(g.count for g in scene.groups)
        for obj in objects:
            x, y = (int(v) for v in obj.center)
            observed = pixels[y, x]
            assert np.abs(observed - np.array(obj.rgb)).max() < 25, (observed, obj)
            nearest = names[int(np.argmin(((palette - observed) ** 2).sum(1)))]
            assert nearest == scene.groups[obj.group].color


def test_no_single_word_identifies_an_image(train):
    images_per_word = defaultdict(set)
    for i, caps in enumerate(train.captions):
        for caption in caps:
            for word in re.findall(r"[a-z]+", caption):
                images_per_word[word].add(i)
    rarest = min(len(v) for v in images_per_word.values())
    # Even the most specific word (a rare synonym) is shared by several images out of 240.
    assert rarest >= 4, sorted(images_per_word, key=lambda w: len(images_per_word[w]))[:5]


def test_scenes_are_shared_and_near_duplicates_exist(train):
    signatures = defaultdict(list)
    for i, scene in enumerate(train.scenes):
        signatures[(scene.groups, scene.relation)].append(i)
    shared = sum(len(v) for v in signatures.values() if len(v) > 1) / N
    assert shared > 0.1
    dups = np.flatnonzero(train.duplicate_of >= 0)
    assert len(dups) > 0.05 * N
    i = int(dups[0])
    j = int(train.duplicate_of[i])
    assert train.scenes[i] == train.scenes[j] and train.images[i] != train.images[j]
    # A caption of i describes j equally well: same (colour, shape) groups named.
    assert set(_mentions(train.captions[i][0])) == {(g.color, g.shape) for g in train.scenes[j].groups}


def test_distractors_are_deterministic_and_use_other_shapes():
    a = synthetic.distractor_images(6, seed=2, image_size=48)
    assert a == synthetic.distractor_images(6, seed=2, image_size=48)
    assert a != synthetic.distractor_images(6, seed=3, image_size=48)
    assert all(_decode(x).shape == (48, 48, 3) for x in a)
    rng = np.random.default_rng(0)
    scenes = [synthetic.sample_scene(rng, synthetic.DISTRACTOR_SHAPES) for _ in range(50)]
    assert not {g.shape for s in scenes for g in s.groups} & set(SHAPES)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="split"):
        synthetic.generate_split("dev", 3)
    with pytest.raises(ValueError, match="num_images"):
        synthetic.generate_split("train", 0)
