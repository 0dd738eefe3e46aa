"""On-disk layout of an export and atomic, versioned publishing of its parts.

An export directory follows TF Serving's convention, one folder per servable with numeric version folders:

    <export_dir>/text_encoder/<version>/   SavedModel (+ assets.extra/ce_retrieval_export.json)
    <export_dir>/image_encoder/<version>/  SavedModel (+ assets.extra/ce_retrieval_export.json)
    <export_dir>/index/<version>/          ScaNN index + manifest.json, built from image_encoder/<version>

Why atomic: TF Serving and the retrieval service poll these folders and load any new numeric folder they
see. A part is therefore written to a hidden temporary sibling (``.tmp-...``; TF Serving ignores non-numeric
names) and moved into place with one ``os.rename``, which is atomic on POSIX within a file system. A crash
mid-write leaves only a hidden temporary folder, never a partial version, and earlier versions untouched.
A version counts as *complete* only when both encoders carry the same ``export_id``; readers use
:func:`complete_versions`, so even a crash between the two renames never exposes a half export.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid

TEXT_ENCODER = "text_encoder"
IMAGE_ENCODER = "image_encoder"
INDEX = "index"
EXPORT_METADATA = os.path.join("assets.extra", "ce_retrieval_export.json")
INDEX_MANIFEST = "manifest.json"
_TMP_PREFIX = ".tmp-"


def versions(parent: str) -> list[int]:
    """Numeric version folders directly under ``parent`` (ascending); hidden/temporary folders are ignored."""
    if not os.path.isdir(parent):
        return []
    found = []
    for name in os.listdir(parent):
        if name.isdigit() and os.path.isdir(os.path.join(parent, name)):
            found.append(int(name))
    return sorted(found)


def version_dir(export_dir: str, part: str, version: int) -> str:
    return os.path.join(export_dir, part, str(int(version)))


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def export_metadata(export_dir: str, part: str, version: int) -> dict:
    path = os.path.join(version_dir(export_dir, part, version), EXPORT_METADATA)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: {part} version {version} was not written by ce_retrieval export")
    return read_json(path)


def complete_versions(export_dir: str) -> list[int]:
    """Versions present for both encoders with matching ``export_id`` (ascending)."""
    complete = []
    for v in sorted(set(versions(os.path.join(export_dir, TEXT_ENCODER))) & set(versions(os.path.join(export_dir, IMAGE_ENCODER)))):
        try:
            ids = {export_metadata(export_dir, part, v).get("export_id") for part in (TEXT_ENCODER, IMAGE_ENCODER)}
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        if len(ids) == 1 and None not in ids:
            complete.append(v)
    return complete


def servable_versions(export_dir: str) -> list[int]:
    """Complete encoder versions that also have an index: what a searcher can serve (ascending)."""
    indexed = set(versions(os.path.join(export_dir, INDEX)))
    return [v for v in complete_versions(export_dir) if v in indexed and os.path.isfile(os.path.join(version_dir(export_dir, INDEX, v), INDEX_MANIFEST))]


def next_version(export_dir: str) -> int:
    """One more than any numeric version of any part (complete or not), so versions never get reused."""
    seen = [v for part in (TEXT_ENCODER, IMAGE_ENCODER, INDEX) for v in versions(os.path.join(export_dir, part))]
    return max(seen, default=0) + 1


def temp_dir_for(final_dir: str) -> str:
    """A fresh hidden sibling of ``final_dir`` on the same file system (so the final rename is atomic)."""
    parent = os.path.dirname(os.path.abspath(final_dir))
    os.makedirs(parent, exist_ok=True)
    return os.path.join(parent, f"{_TMP_PREFIX}{os.path.basename(final_dir)}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def fsync_tree(root: str) -> None:
    """Flush every file and folder under ``root`` to disk before it is published."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        with contextlib.suppress(OSError):
            fd = os.open(dirpath, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def publish(temp_dir: str, final_dir: str, *, overwrite: bool = False) -> None:
    """Atomically move a finished ``temp_dir`` to ``final_dir``.

    Without ``overwrite`` an existing ``final_dir`` is an error. With it, the old folder is first renamed aside
    (hidden) and removed only after the new one is in place, so readers see either the old or the new version.
    """
    fsync_tree(temp_dir)
    aside = None
    if os.path.exists(final_dir):
        if not overwrite:
            raise FileExistsError(f"{final_dir} already exists; versions are immutable (pick a new version or overwrite=True)")
        aside = temp_dir_for(final_dir) + "-old"
        os.rename(final_dir, aside)
    try:
        os.rename(temp_dir, final_dir)
    except BaseException:
        if aside is not None:
            os.rename(aside, final_dir)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def remove_quietly(path: str | None) -> None:
    if path and os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)
