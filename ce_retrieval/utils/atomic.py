"""Atomic writes: write to a temporary sibling, fsync, then ``os.replace`` (readers see old or new, never half).

Every artefact the library writes goes through this module:

* :func:`atomic_write_text` / :func:`atomic_write_bytes`: a whole file from a string / bytes;
* :func:`atomic_path`: a temporary path for writers that want a file name (``tf.io.TFRecordWriter``,
  ``np.save``, ``fig.savefig``, ``shutil.copyfile``); the temporary name keeps the final extension, so writers
  that infer the format from it (matplotlib) or append one (NumPy) see the right one;
* :func:`atomic_directory` (and its parts :func:`temp_dir_for`, :func:`publish_directory`,
  :func:`remove_tree`): a whole folder (a SavedModel, an index) built in a hidden sibling and moved into place
  with one ``os.rename``.

Temporary files and folders are hidden siblings of the target (same file system, so the rename is atomic; a
leading dot keeps them out of ``glob`` patterns and TF Serving's numeric version scan). A failure removes them;
folders left by a writer killed with SIGKILL are removed by the next writer of the same place.
A written file gets the permissions a plain ``open(path, "w")`` gives (0666 less the umask), not
``tempfile.mkstemp``'s owner-only 0600, so a reader running as another user (TF Serving) can read it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterator

_TMP_DIR_PREFIX = ".tmp-"


@contextlib.contextmanager
def atomic_path(path: str, *, fsync: bool = True) -> Iterator[str]:
    """``with atomic_path(path) as tmp: write(tmp)``: on a clean exit ``tmp`` is fsynced (unless ``fsync=False``)
    and renamed to ``path``; on an exception it is removed and ``path`` is left as it was. The parent folder is
    created."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    base = os.path.basename(path)
    tmp = os.path.join(directory, f".{base}.{uuid.uuid4().hex[:12]}.tmp{os.path.splitext(base)[1]}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the mode open() gives (umask applies)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str, text: str, encoding: str = "utf-8", *, fsync: bool = True) -> None:
    atomic_write_bytes(path, text.encode(encoding), fsync=fsync)


def atomic_write_bytes(path: str, data: bytes, *, fsync: bool = True) -> None:
    with atomic_path(path, fsync=fsync) as tmp, open(tmp, "wb") as f:
        f.write(data)


# --------------------------------------------------------------------------------------------- folders
def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


_TMP_DIR_NAME = re.compile(r"^\.tmp-.+-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]{8}(-old)?$")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def remove_stale_temp_dirs(parent: str) -> list[str]:
    """Removes the hidden temporary folders under ``parent`` that a killed writer left (a SIGKILL runs no clean-up).

    A folder is stale when its name says it was made on this host by a process that no longer exists. Folders
    of live writers, of other hosts sharing the file system, and anything not named by :func:`temp_dir_for` are
    left alone. Returns the removed paths.
    """
    removed = []
    if not os.path.isdir(parent):
        return removed
    host = _host_tag()
    for name in os.listdir(parent):
        m = _TMP_DIR_NAME.match(name)
        if m and m["host"] == host and int(m["pid"]) != os.getpid() and not _process_alive(int(m["pid"])):
            path = os.path.join(parent, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def temp_dir_for(final_dir: str) -> str:
    """A fresh hidden sibling of ``final_dir`` on the same file system (so the final rename is atomic), named
    ``.tmp-<name>-<host>-<pid>-<random>``; leftovers of killed writers beside it are removed first
    (:func:`remove_stale_temp_dirs`)."""
    parent = os.path.dirname(os.path.abspath(final_dir))
    os.makedirs(parent, exist_ok=True)
    remove_stale_temp_dirs(parent)
    base = os.path.basename(final_dir)
    return os.path.join(parent, f"{_TMP_DIR_PREFIX}{base}-{_host_tag()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


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


def publish_directory(temp_dir: str, final_dir: str, *, overwrite: bool = False) -> None:
    """Atomically move a finished ``temp_dir`` to ``final_dir``.

    Without ``overwrite`` an existing ``final_dir`` is an error. With it, the old folder is first renamed aside
    (hidden) and removed only after the new one is in place, so readers see either the old or the new version.
    """
    fsync_tree(temp_dir)
    aside = None
    if os.path.exists(final_dir):
        if not overwrite:
            raise FileExistsError(
                f"{final_dir} already exists; versions are immutable (pick a new version or overwrite=True)"
            )
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


def remove_tree(path: str | None) -> None:
    """Removes a folder (a temporary one, or a half-published version being rolled back), quietly."""
    if path and os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(final_dir: str, *, overwrite: bool = False) -> Iterator[str]:
    """``with atomic_directory(final) as tmp: fill(tmp)``: an empty hidden folder that, on a clean exit, is
    published as ``final_dir`` (:func:`publish_directory`); it is removed in every case."""
    tmp = temp_dir_for(final_dir)
    try:
        os.makedirs(tmp)
        yield tmp
        publish_directory(tmp, final_dir, overwrite=overwrite)
    finally:
        remove_tree(tmp)
