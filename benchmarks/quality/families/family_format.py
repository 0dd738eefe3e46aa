"""A dataset family on disk: the examples in a real format, plus the ground truth the labels cannot hold.

A family split is images with unique ids, their captions, a multi-hot attribute vector per image (the
pretraining target of the frozen-feature regime) and, per caption, the set of facts it *claims*; a caption fits
every image whose facts contain its claim (``claim ⊆ facts(image)``).

The examples are written in a format a user would have — Karpathy split JSON + PNG files
(:func:`write_karpathy`) or TFRecord shards (:func:`write_tfrecord`) — and read back with the project's real
loaders (:func:`ce_retrieval.data.load_retrieval_split` / ``load_examples``). Those loaders, like the training
step and the evaluation, define relevance by ids: caption i is relevant to image j iff ``id_i == id_j`` and
image ids are unique, so a caption is relevant to at most one image. That cannot express a vague caption that
fits several images: the other images it fits are *unlabelled positives* (false negatives in a batch, wrong
"misses" at test time), exactly as in COCO or Flickr30k. The family therefore writes a sidecar beside the
examples — ``sidecar/<split>.npz`` (image ids, attributes) and ``sidecar/<split>_fits.json`` (caption text ->
ids of every image of the split it fits) — that the benchmark's analysis reads (:func:`read_sidecar`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from ce_retrieval.data.config import DataConfig, SplitPaths
from ce_retrieval.data.export import write_karpathy_index
from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID
from ce_retrieval.data.tfrecords import write_tfrecords
from ce_retrieval.utils.atomic import atomic_write_text


@dataclasses.dataclass
class FamilySplit:
    """Image k: ``images[k]`` (PNG bytes), id ``image_ids[k]``, ``captions[k]`` (with ``claims[k]``, one
    frozenset of facts per caption), ``facts[k]`` (what it shows) and ``attributes[k]`` (multi-hot)."""

    images: list[bytes]
    image_ids: np.ndarray
    captions: list[list[str]]
    claims: list[list[frozenset]]
    facts: list[frozenset]
    attributes: np.ndarray

    def fits(self) -> dict[str, list[int]]:
        """Caption text -> the ids of every image of this split whose facts contain the caption's claim."""
        holders: dict[str, set[int]] = {}
        for k, facts in enumerate(self.facts):
            for fact in facts:
                holders.setdefault(fact, set()).add(k)
        out: dict[str, list[int]] = {}
        for caps, claims in zip(self.captions, self.claims, strict=True):
            for caption, claim in zip(caps, claims, strict=True):
                if caption in out:
                    continue
                if not claim:
                    raise ValueError(f"caption {caption!r} claims nothing")
                images = set.intersection(*(holders.get(f, set()) for f in claim))
                out[caption] = sorted(int(self.image_ids[k]) for k in images)
        return out


def _sidecar(splits: dict[str, FamilySplit], out_dir: str) -> None:
    folder = os.path.join(out_dir, "sidecar")
    os.makedirs(folder, exist_ok=True)
    for split, data in splits.items():
        path = os.path.join(folder, f"{split}.npz")
        np.savez(path + ".tmp.npz", image_ids=data.image_ids, attributes=data.attributes)
        os.replace(path + ".tmp.npz", path)
        atomic_write_text(os.path.join(folder, f"{split}_fits.json"), json.dumps(data.fits()))


def write_karpathy(splits: dict[str, FamilySplit], out_dir: str, dataset: str) -> DataConfig:
    """``out_dir/dataset_<dataset>.json`` (Karpathy split format) + ``out_dir/<split>/<id>.png`` + the sidecar;
    returns the ``karpathy`` config that reads them."""
    index = write_karpathy_index(splits, out_dir, dataset)
    _sidecar(splits, out_dir)
    return DataConfig(name="karpathy", karpathy_json=index, image_root=out_dir)


def write_tfrecord(splits: dict[str, FamilySplit], out_dir: str, num_shards: int = 2) -> DataConfig:
    """``out_dir/<split>-*-of-*`` TFRecord shards (one example per caption) + the sidecar; returns the
    ``tfrecord`` config that reads them."""
    patterns = {}
    for split, data in splits.items():
        examples = (
            {CAPTION: c, IMAGE: data.images[k], IMAGE_ID: data.image_ids[k]}
            for k, caps in enumerate(data.captions)
            for c in caps
        )
        write_tfrecords(examples, os.path.join(out_dir, split), num_shards=num_shards, validate=False)
        patterns[split] = os.path.join(out_dir, f"{split}-*-of-*")
    _sidecar(splits, out_dir)
    return DataConfig(name="tfrecord", tfrecord_pattern=SplitPaths(**patterns))


def read_sidecar(out_dir: str, split: str, image_ids=None) -> dict:
    """``{"image_ids", "attributes", "fits"}`` of a written split; with ``image_ids`` the attributes are
    returned in that order (e.g. the order a loader produced), and an id the family did not write is an error."""
    folder = os.path.join(out_dir, "sidecar")
    with np.load(os.path.join(folder, f"{split}.npz")) as z:
        ids, attributes = z["image_ids"], z["attributes"]
    with open(os.path.join(folder, f"{split}_fits.json"), encoding="utf-8") as f:
        fits = json.load(f)
    if image_ids is not None:
        image_ids = np.asarray(image_ids, np.int64)
        order = np.argsort(ids)
        pos = np.searchsorted(ids[order], image_ids)
        pos = np.minimum(pos, len(ids) - 1)
        if not np.array_equal(ids[order][pos], image_ids):
            missing = image_ids[ids[order][pos] != image_ids][:5].tolist()
            raise ValueError(f"{folder}: image ids {missing} of split {split!r} are not in the family's sidecar")
        ids, attributes = image_ids, attributes[order][pos]
    return {"image_ids": ids, "attributes": attributes, "fits": fits}
