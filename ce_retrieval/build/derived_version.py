"""A new export version derived from an existing one without retraining: same encoders, a rewritten index.

Why a new version: the service and TF Serving load only *newer* version numbers, and versions are immutable, so a
change to what an index promises (``ce-retrieval calibrate``'s new thresholds) is published as version w =
``next_version`` whose parts are copies of version v's:

    text_encoder/<w>/, image_encoder/<w>/   version v's SavedModels, new export metadata (``version`` w, a fresh
                                            ``export_id`` shared by both, ``derived_from``: v, its export_id, why)
    index/<w>/                              version v's index with manifests rewritten by the caller

Copies cost no disk and no time: every file is a hard link to version v's (a copy where the file system has no
hard links); only the rewritten files (export metadata, manifests) are new, and they are written by
``atomic_write`` (a new file renamed over the link), so version v is never modified.

Crash safety, in the order ``export`` then ``index`` publish: each part is filled in a hidden temporary folder and
moved into place with one rename (``utils.atomic``), text encoder, image encoder, then the index, whose rename
makes version w servable (``layout.servable_versions``). A kill at any point leaves hidden temporary folders,
at most w's encoders without their index (never served by ce_retrieval; TF Serving would serve them, and they
are version v's weights), and version v untouched. The next derivation removes such an abandoned version (its
encoders say ``derived_from`` and it has no index), renaming each folder aside before deleting it, so no reader
ever sees a half-deleted one; its number is not reused. One derivation runs at a time per export directory
(an exclusive lock on ``<export_dir>/.derive.lock``).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator

from ce_retrieval.search import layout
from ce_retrieval.utils import atomic

__all__ = ["LOCK_FILE", "abandoned_versions", "derive_version", "link_tree"]

LOCK_FILE = ".derive.lock"
ENCODERS = (layout.TEXT_ENCODER, layout.IMAGE_ENCODER)


@contextlib.contextmanager
def export_lock(export_dir: str) -> Iterator[None]:
    """Holds the export directory's derivation lock; RuntimeError at once if another process holds it."""
    fd = os.open(os.path.join(export_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(
                f"another process is publishing a derived version of {export_dir}; retry later"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # no hard links on this file system (or across devices): a real copy
        shutil.copy2(src, dst)


def link_tree(src: str, dst: str) -> None:
    """``dst`` (must not exist) as a copy of folder ``src`` whose files are hard links to ``src``'s."""
    shutil.copytree(src, dst, copy_function=_link_or_copy)


def _retire(path: str) -> None:
    """Removes a published folder without showing a partial one: one rename to a hidden sibling, then deletion
    (a kill in between leaves the hidden folder, which the next writer beside it removes)."""
    if os.path.exists(path):
        aside = atomic.temp_dir_for(path) + "-old"
        os.rename(path, aside)
        atomic.remove_tree(aside)


def abandoned_versions(export_dir: str) -> list[int]:
    """Versions a killed derivation left: encoder folders whose metadata says ``derived_from`` and whose index
    was never published."""
    found = set()
    for part in ENCODERS:
        for v in layout.versions(os.path.join(export_dir, part)):
            try:
                meta = layout.export_metadata(export_dir, part, v)
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            indexed = os.path.isfile(
                os.path.join(layout.version_dir(export_dir, layout.INDEX, v), layout.INDEX_MANIFEST)
            )
            if "derived_from" in meta and not indexed:
                found.add(v)
    return sorted(found)


def derive_version(
    export_dir: str, from_version: int, rewrite_index: Callable[[str, dict, int], dict], reason: dict
) -> tuple[int, dict]:
    """Publishes a new version derived from servable version ``from_version`` (module docstring); returns the
    new version number and its index manifest.

    ``rewrite_index(index_dir, image_encoder_metadata, version)`` rewrites the manifest(s) of the linked index copy
    in ``index_dir`` for the new version (only by atomic writes: never a file in place) and returns the top-level
    manifest; it must leave a folder that loads. ``reason`` (JSON-able) goes into the encoders' ``derived_from``.
    """
    export_dir = os.path.abspath(export_dir)
    if from_version not in layout.servable_versions(export_dir):
        raise FileNotFoundError(f"version {from_version} of {export_dir} is not servable (encoders and an index)")
    with export_lock(export_dir):
        version = layout.next_version(export_dir)  # before the clean-up: an abandoned number is never reused
        for v in abandoned_versions(export_dir):
            for part in (layout.IMAGE_ENCODER, layout.TEXT_ENCODER):  # image first: never a lone image encoder
                _retire(layout.version_dir(export_dir, part, v))
        export_id = uuid.uuid4().hex
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        finals = {p: layout.version_dir(export_dir, p, version) for p in (*ENCODERS, layout.INDEX)}
        temps: dict[str, str] = {}
        published: list[str] = []
        try:
            for part, final in finals.items():
                temps[part] = atomic.temp_dir_for(final)
                link_tree(layout.version_dir(export_dir, part, from_version), temps[part])
            for part in ENCODERS:
                meta = layout.export_metadata(export_dir, part, from_version)
                derived = {"version": from_version, "export_id": meta["export_id"], **reason}
                meta.update(version=version, export_id=export_id, created_at=now, derived_from=derived)
                layout.write_json(os.path.join(temps[part], layout.EXPORT_METADATA), meta)
            image_meta = layout.read_json(os.path.join(temps[layout.IMAGE_ENCODER], layout.EXPORT_METADATA))
            manifest = rewrite_index(temps[layout.INDEX], image_meta, version)
            for part in (*ENCODERS, layout.INDEX):  # the index last: its rename makes the version servable
                atomic.publish_directory(temps[part], finals[part])
                published.append(finals[part])
        except BaseException:
            for path in reversed(published):  # roll back: never leave encoders that no index will follow
                _retire(path)
            raise
        finally:
            for path in temps.values():
                atomic.remove_tree(path)
    return version, manifest
