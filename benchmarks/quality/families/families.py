"""Dataset families that differ in kind, built by the project, written in real formats, read by real loaders.

    shapes   today's synthetic scenes and captions (``ce_retrieval.data.synthetic``) -> TFRecord shards
    vague    synthetic scenes, most captions name one or two attributes only       -> Karpathy JSON + PNGs
             (``vague_captions.py``: a caption fits many images)
    digits   scikit-learn's handwritten digits, two per scene (``digit_scenes.py``) -> Karpathy JSON + PNGs

:func:`build_family` writes a family under a folder once (``family.json`` records what was written; the same
request again reuses it) and returns the :class:`DataConfig` of the real loader that reads it; the loader's
split is the benchmark's data, and ``family_format.read_sidecar`` gives the attributes and caption fits.
:func:`family_distractors` gives images relevant to no caption of the family (the distractor gallery).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from benchmarks.quality.families.digit_scenes import digit_distractors, generate_digit_split
from benchmarks.quality.families.family_format import FamilySplit, write_karpathy, write_tfrecord
from benchmarks.quality.families.scene_facts import full_caption_claim, scene_attributes, scene_facts
from benchmarks.quality.families.vague_captions import generate_vague_split
from ce_retrieval.data import synthetic
from ce_retrieval.data.config import SPLITS, DataConfig
from ce_retrieval.utils.atomic import atomic_write_text

FAMILIES = ("shapes", "vague", "digits")
FORMATS = {"shapes": "tfrecord", "vague": "karpathy", "digits": "karpathy"}
LAYOUT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class FamilySize:
    """How many images per split, captions per image, image side and the data seed."""

    num_train: int = 3000
    num_val: int = 500
    num_test: int = 500
    captions_per_image: int = 5
    image_size: int = 64
    seed: int = 0

    def count(self, split: str) -> int:
        return {"train": self.num_train, "val": self.num_val, "test": self.num_test}[split]


def _shapes_split(split: str, size: FamilySize) -> FamilySplit:
    data = synthetic.generate_split(
        split,
        size.count(split),
        captions_per_image=size.captions_per_image,
        image_size=size.image_size,
        seed=size.seed,
    )
    claims = [
        [full_caption_claim(scene, c) for c in caps] for scene, caps in zip(data.scenes, data.captions, strict=True)
    ]
    return FamilySplit(
        data.images,
        data.image_ids,
        data.captions,
        claims,
        [scene_facts(s) for s in data.scenes],
        np.stack([scene_attributes(s) for s in data.scenes]),
    )


def generate_family_split(family: str, split: str, size: FamilySize) -> FamilySplit:
    """One split of ``family`` in memory (deterministic in ``size.seed``)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown dataset family {family!r}; expected one of {FAMILIES}")
    if family == "shapes":
        return _shapes_split(split, size)
    kwargs = {"captions_per_image": size.captions_per_image, "image_size": size.image_size, "seed": size.seed}
    if family == "vague":
        return generate_vague_split(split, size.count(split), **kwargs)
    return generate_digit_split(split, size.count(split), **kwargs)


def build_family(family: str, out_dir: str, size: FamilySize = FamilySize()) -> DataConfig:
    """Writes ``family`` under ``out_dir`` (unless ``family.json`` says this exact request is already there) and
    returns the config of the real loader that reads it."""
    if family not in FAMILIES:
        raise ValueError(f"unknown dataset family {family!r}; expected one of {FAMILIES}")
    request = {"family": family, "size": dataclasses.asdict(size), "layout": LAYOUT_VERSION}
    marker = os.path.join(out_dir, "family.json")
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            written = json.load(f)
        if written.get("request") == request:
            return DataConfig(**written["data_config"])
    os.makedirs(out_dir, exist_ok=True)
    splits = {s: generate_family_split(family, s, size) for s in SPLITS}
    if FORMATS[family] == "tfrecord":
        cfg = write_tfrecord(splits, out_dir)
    else:
        cfg = write_karpathy(splits, out_dir, family)
    cfg = dataclasses.replace(cfg, image_size=size.image_size)
    atomic_write_text(marker, json.dumps({"request": request, "data_config": cfg.to_dict()}, indent=1))
    return cfg


def family_distractors(family: str, n: int, seed: int = 0, image_size: int = 64) -> list[bytes]:
    """``n`` images relevant to no caption of ``family``: unnamed shapes, or photograph crops for digits."""
    if family == "digits":
        return digit_distractors(n, seed=seed, image_size=image_size)
    return synthetic.distractor_images(n, seed=seed + 7919, image_size=image_size)
