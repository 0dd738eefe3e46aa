"""Where a gallery's images come from, read one way by ``ce-retrieval index`` and the Beam pipeline alike.

:func:`resolve_source` reads a gallery argument as a folder of .jpg/.png files (integer file names become ids,
else row i of the sorted listing has id i), else a TFRecord file pattern in the format of
:mod:`ce_retrieval.data.tfrecords` (one record per caption: an image id repeats), else a split name of a data
config (Karpathy JSON / Conceptual-Captions TSV listed by the scanners of :mod:`ce_retrieval.data.sources`
without decoding; TFRecord configs read their pattern; the synthetic set is generated here). The result is a
:class:`GallerySource`: what to read, not the bytes, so the Beam pipeline reads it on its workers.
:func:`read_images` reads one in this process (``ce-retrieval index --images``), one entry per image id.
"""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np

from ce_retrieval.data.config import SPLITS, DataConfig
from ce_retrieval.data.report import DataError, image_problem
from ce_retrieval.data.schema import IMAGE, IMAGE_ID
from ce_retrieval.utils.dataclass_yaml import from_dict

__all__ = [
    "IMAGE_SUFFIXES",
    "CorruptImageError",
    "GallerySource",
    "data_config_of",
    "read_images",
    "resolve_source",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class CorruptImageError(DataError):
    """A gallery image that does not decode, met with ``on_corrupt="fail"``; the message names record, id, reason."""


@dataclasses.dataclass(frozen=True)
class GallerySource:
    """What to read. ``kind`` is ``tfrecord`` (``files``: TFRecord paths), ``files`` (``items``: (id, image
    path) read on the workers) or ``memory`` (``items``: (id, where, bytes) made in the driver). ``info`` goes
    into the manifest."""

    kind: str
    info: dict
    files: tuple[str, ...] = ()
    items: tuple = ()


def glob_files(pattern: str) -> list[str]:
    """Sorted files matching ``pattern``; a URL pattern (``gs://...``) through ``tf.io.gfile``."""
    if "://" in pattern:
        import tensorflow as tf

        return sorted(tf.io.gfile.glob(pattern))
    return sorted(glob.glob(pattern))


def folder_source(folder: str) -> GallerySource:
    """The .jpg/.png files of ``folder``: integer file names are the ids (refused if two name one id), else row i
    of the sorted listing has id i (``info["names"]`` keeps the names)."""
    names = sorted(f for f in os.listdir(folder) if f.lower().endswith(IMAGE_SUFFIXES))
    if not names:
        raise FileNotFoundError(f"no .jpg/.jpeg/.png files in {folder}")
    stems = [os.path.splitext(f)[0] for f in names]
    info: dict = {"kind": "folder", "path": os.path.abspath(folder), "files": len(names)}
    if all(s.isdigit() for s in stems):
        ids = [int(s) for s in stems]
        if len(set(ids)) != len(ids):
            seen: dict[int, str] = {}
            clashes = [f"{seen[i]} and {n}" for i, n in zip(ids, names, strict=True) if seen.setdefault(i, n) != n]
            raise ValueError(f"{folder}: several files name the same image id: {', '.join(clashes[:5])}")
    else:
        ids = list(range(len(names)))
        info["names"] = names  # row i of the sorted listing has id i (as ``ce-retrieval index`` does)
    paths = [os.path.join(os.path.abspath(folder), n) for n in names]
    return GallerySource("files", info, items=tuple(zip(ids, paths, strict=True)))


def tfrecord_source(pattern: str, files: list[str], extra: dict | None = None) -> GallerySource:
    info = {"kind": "tfrecord", "pattern": pattern, "files": len(files), **(extra or {})}
    return GallerySource("tfrecord", info, files=tuple(files))


def data_config_of(export_meta: dict | None, data_config=None) -> DataConfig:
    """``data_config`` (a DataConfig or its dict), else the data config stored in an export's metadata."""
    if data_config is None:
        data_config = (((export_meta or {}).get("metadata") or {}).get("config") or {}).get("data")
        if data_config is None:
            raise ValueError(
                "a split name needs a data config, and this export carries none: pass data_config, an image folder "
                "or a TFRecord pattern"
            )
    return from_dict(DataConfig, data_config, "config.data") if isinstance(data_config, dict) else data_config


def split_source(split: str, cfg, on_corrupt: str) -> GallerySource:
    """A split of data config ``cfg``: its TFRecord files, the synthetic images, or the (id, path) listing of a
    JSON/TSV source (missing files skipped or refused per ``on_corrupt``)."""
    info = {"kind": "split", "split": split, "data_source": cfg.name}
    if cfg.name == "tfrecord":
        pattern = cfg.tfrecord_pattern.get(split)
        files = glob_files(pattern)
        if not files:
            raise FileNotFoundError(f"split {split!r}: no TFRecord files match {pattern!r}")
        return tfrecord_source(pattern, files, info)
    if cfg.name == "synthetic":
        from ce_retrieval.data.synthetic import split_from_config

        data = split_from_config(cfg, split)
        items = tuple(
            (int(i), f"synthetic {split} image {i}", bytes(b)) for i, b in zip(data.image_ids, data.images, strict=True)
        )
        return GallerySource("memory", {**info, "images": len(items)}, items=items)
    from ce_retrieval.data import sources

    # List (id, path) only: no decoding in the driver (the pipeline checks each image on the workers). A missing
    # file is still found by the scanner (a cheap stat) and skipped or raised per on_corrupt.
    listing_cfg = dataclasses.replace(cfg, validate_images=False, skip_corrupt=on_corrupt == "skip")
    scanned = sources.scan(listing_cfg, split)
    report = scanned.report
    info.update(
        images=len(scanned.image_paths),
        scan={
            "source": report.source,
            "rows": report.rows,
            "bad_rows": report.bad_rows,
            "missing_images": report.missing_images,
            "problems": list(report.problems),
        },
    )
    items = tuple((int(i), p) for i, p in zip(scanned.image_ids, scanned.image_paths, strict=True))
    return GallerySource("files", info, items=items)


def resolve_source(
    source: str, *, data_config=None, export_meta: dict | None = None, on_corrupt: str = "skip"
) -> GallerySource:
    """Interprets ``source`` as ``ce-retrieval index --images`` does: a folder of images, else a TFRecord file
    pattern that matches files, else a split name (``train``/``val``/``test``) of ``data_config`` (a
    ``DataConfig`` or its dict; by default the data config stored in the export's metadata)."""
    if os.path.isdir(source):
        return folder_source(source)
    files = glob_files(source)
    if files:
        return tfrecord_source(source, files)
    if source in SPLITS:
        return split_source(source, data_config_of(export_meta, data_config), on_corrupt)
    raise FileNotFoundError(
        f"gallery {source!r} is not a folder, matches no (TFRecord) file, and is not a split name {SPLITS}"
    )


def _tfrecord_images(files) -> tuple[list[bytes], list[int], list[str]]:
    """Each image id's first record in (file, record) order: its bytes, its id, where it was read."""
    import tensorflow as tf

    spec = {IMAGE: tf.io.FixedLenFeature([], tf.string), IMAGE_ID: tf.io.FixedLenFeature([], tf.int64)}
    seen: dict[int, tuple[bytes, str]] = {}
    for path in files:
        for index, rec in enumerate(tf.data.TFRecordDataset(path).map(lambda r: tf.io.parse_single_example(r, spec))):
            seen.setdefault(int(rec[IMAGE_ID]), (rec[IMAGE].numpy(), f"{path} record {index}"))
    return [b for b, _ in seen.values()], list(seen), [w for _, w in seen.values()]


def read_images(src: GallerySource, on_corrupt: str | None = None) -> tuple[list[bytes], np.ndarray]:
    """The encoded images of ``src`` and their int64 ids, in the source's order (a TFRecord image at its first
    record). ``on_corrupt``: None reads the bytes unchecked (the encoder meets them); ``"skip"`` drops and
    ``"fail"`` refuses (:class:`CorruptImageError`) an image :func:`ce_retrieval.data.report.image_problem`
    cannot decode."""
    if src.kind == "tfrecord":
        images, ids, where = _tfrecord_images(src.files)
    elif src.kind == "memory":
        ids, where, images = (list(column) for column in zip(*src.items, strict=True)) if src.items else ([], [], [])
    else:
        ids, where = [i for i, _ in src.items], [p for _, p in src.items]
        images = []
        for path in where:
            with open(path, "rb") as f:
                images.append(f.read())
    if on_corrupt is not None:
        keep = []
        for row, (image_id, data, place) in enumerate(zip(ids, images, where, strict=True)):
            problem = image_problem(data)
            if problem is None:
                keep.append(row)
            elif on_corrupt == "fail":
                raise CorruptImageError(
                    f"corrupt gallery image: id {image_id} in {place}: {problem} (on_corrupt='skip' skips such images)"
                )
        images, ids = [images[r] for r in keep], [ids[r] for r in keep]
    return list(images), np.asarray(ids, dtype=np.int64)
