"""Write the synthetic set in the real formats (Karpathy JSON + PNG files, CC TSV, TFRecords).

Why: it lets every real-format code path (loaders, the training job, evaluation) run on a set whose content
is known, and gives users a template of each on-disk layout. :func:`export_synthetic` returns a
:class:`DataConfig` that reads the written files back; loading it gives the same examples as the synthetic
source (tested).
"""

from __future__ import annotations

import dataclasses
import json
import os

from ce_retrieval.data import synthetic
from ce_retrieval.data.config import SPLITS, DataConfig, SplitPaths
from ce_retrieval.data.schema import CAPTION, IMAGE, IMAGE_ID
from ce_retrieval.data.tfrecords import write_tfrecords
from ce_retrieval.utils.atomic import atomic_write_bytes, atomic_write_text

FORMATS = ("karpathy", "cc_tsv", "tfrecord")


def _image_name(image_id: int) -> str:
    return f"{image_id:010d}.png"


def _write_images(data: synthetic.SyntheticSplit, folder: str) -> None:
    # Each image appears whole or not at all; no fsync per image (thousands of files), the index that names
    # them is written (and fsynced) after them.
    for image, image_id in zip(data.images, data.image_ids.tolist(), strict=True):
        atomic_write_bytes(os.path.join(folder, _image_name(image_id)), image, fsync=False)


def write_karpathy_index(splits: dict, out_dir: str, dataset: str) -> str:
    """Writes every split's images as ``out_dir/<split>/<id>.png`` and their captions as a Karpathy split file
    ``out_dir/dataset_<dataset>.json`` (``filepath``/``filename``/``split``/``imgid``/``sentences``); returns its
    path. ``splits``: ``{split: data}`` with ``image_ids``, ``captions`` and ``images`` as a synthetic split's."""
    entries = []
    for split, data in splits.items():
        _write_images(data, os.path.join(out_dir, split))
        for image_id, captions in zip(data.image_ids.tolist(), data.captions, strict=True):
            entries.append(
                {
                    "filepath": split,
                    "filename": _image_name(image_id),
                    "split": split,
                    "imgid": image_id,
                    "sentences": [{"raw": c, "tokens": c.split()} for c in captions],
                }
            )
    index = os.path.join(out_dir, f"dataset_{dataset}.json")
    atomic_write_text(index, json.dumps({"dataset": dataset, "images": entries}))
    return index


def export_synthetic(cfg: DataConfig, out_dir: str, fmt: str = "karpathy", num_shards: int = 2) -> DataConfig:
    """Write the synthetic splits of ``cfg`` under ``out_dir`` in ``fmt``; return a config that reads them."""
    if cfg.name != "synthetic":
        raise ValueError(f"export_synthetic needs a synthetic DataConfig, got name={cfg.name!r}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; expected one of {FORMATS}")
    os.makedirs(out_dir, exist_ok=True)
    splits = {s: synthetic.split_from_config(cfg, s) for s in SPLITS}
    keep = {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(DataConfig)
        if f.name in ("skip_corrupt", "validate_images", "shuffle_buffer", "vocab_path", "vocab_size")
    }
    if fmt == "karpathy":
        index = write_karpathy_index(splits, out_dir, "synthetic")
        return DataConfig(name="karpathy", karpathy_json=index, image_root=out_dir, **keep)
    if fmt == "cc_tsv":
        paths = {}
        for split, data in splits.items():
            _write_images(data, os.path.join(out_dir, "images"))
            paths[split] = os.path.join(out_dir, f"{split}.tsv")
            atomic_write_text(
                paths[split],
                "".join(
                    f"{c}\t{_image_name(image_id)}\n"
                    for image_id, captions in zip(data.image_ids.tolist(), data.captions, strict=True)
                    for c in captions
                ),
            )
        return DataConfig(
            name="cc_tsv",
            tsv_path=SplitPaths(**paths),
            tsv_image_root=os.path.join(out_dir, "images"),
            tsv_image_id="hash",
            **keep,
        )
    patterns = {}
    for split, data in splits.items():
        examples = (
            {CAPTION: c, IMAGE: data.images[i], IMAGE_ID: data.image_ids[i]}
            for i, caps in enumerate(data.captions)
            for c in caps
        )
        write_tfrecords(examples, os.path.join(out_dir, split), num_shards=num_shards, validate=False)
        patterns[split] = os.path.join(out_dir, f"{split}-*-of-*")
    return DataConfig(name="tfrecord", tfrecord_pattern=SplitPaths(**patterns), **keep)
