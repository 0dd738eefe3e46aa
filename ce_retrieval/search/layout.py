"""On-disk layout of an export and atomic, versioned publishing of its parts.

An export directory follows TF Serving's convention, one folder per servable with numeric version folders:

    <export_dir>/text_encoder/<version>/   SavedModel (+ assets.extra/ce_retrieval_export.json)
    <export_dir>/image_encoder/<version>/  SavedModel (+ assets.extra/ce_retrieval_export.json)
    <export_dir>/index/<version>/          ScaNN index + manifest.json, built from image_encoder/<version>

Why atomic: TF Serving and the retrieval service poll these folders and load any new numeric folder they
see. A part is therefore written to a hidden temporary sibling (``.tmp-...``; TF Serving ignores non-numeric
names) and moved into place with one ``os.rename``, which is atomic on POSIX within a file system
(:func:`ce_retrieval.utils.atomic.atomic_directory` / ``publish_directory``). A crash mid-write leaves only a
hidden temporary folder, never a partial version, and earlier versions untouched.
A version counts as *complete* only when both encoders carry the same ``export_id``; readers use
:func:`complete_versions`, so even a crash between the two renames never exposes a half export.
"""

from __future__ import annotations

import json
import os

from ce_retrieval.utils.atomic import atomic_write_text

TEXT_ENCODER = "text_encoder"
IMAGE_ENCODER = "image_encoder"
INDEX = "index"
EXPORT_METADATA = os.path.join("assets.extra", "ce_retrieval_export.json")
INDEX_MANIFEST = "manifest.json"


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
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def export_metadata(export_dir: str, part: str, version: int) -> dict:
    path = os.path.join(version_dir(export_dir, part, version), EXPORT_METADATA)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: {part} version {version} was not written by ce_retrieval export")
    return read_json(path)


def complete_versions(export_dir: str) -> list[int]:
    """Versions present for both encoders with matching ``export_id`` (ascending)."""
    complete = []
    for v in sorted(
        set(versions(os.path.join(export_dir, TEXT_ENCODER))) & set(versions(os.path.join(export_dir, IMAGE_ENCODER)))
    ):
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
    return [
        v
        for v in complete_versions(export_dir)
        if v in indexed and os.path.isfile(os.path.join(version_dir(export_dir, INDEX, v), INDEX_MANIFEST))
    ]


def half_published(export_dir: str) -> list[str]:
    """Encoder version folders written by ``export`` whose other encoder folder does not exist: what a crash
    between the two renames of a publish leaves (``text_encoder/<v>`` without ``image_encoder/<v>``). Readers
    here ignore them (:func:`complete_versions`), but TF Serving would serve that text encoder next to the
    previous image encoder, so ``export`` removes them (see :func:`ce_retrieval.build.export.export_encoders`)."""
    found = []
    for part, other in ((TEXT_ENCODER, IMAGE_ENCODER), (IMAGE_ENCODER, TEXT_ENCODER)):
        for v in versions(os.path.join(export_dir, part)):
            ours = os.path.isfile(os.path.join(version_dir(export_dir, part, v), EXPORT_METADATA))
            if ours and not os.path.exists(version_dir(export_dir, other, v)):
                found.append(version_dir(export_dir, part, v))
    return found


def next_version(export_dir: str) -> int:
    """One more than any numeric version of any part (complete or not), so versions never get reused."""
    seen = [v for part in (TEXT_ENCODER, IMAGE_ENCODER, INDEX) for v in versions(os.path.join(export_dir, part))]
    return max(seen, default=0) + 1
