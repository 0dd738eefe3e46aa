"""Atomic writes: write to a temporary sibling, fsync, then ``os.replace`` (readers see old or new, never half).

``atomic_directory(path)`` does the same for a whole directory: it is built under a hidden temporary name in the
same parent and renamed into place only when complete; on error the temporary directory is removed and any
existing ``path`` is untouched.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile


def atomic_write_text(path: str, text: str, encoding: str = "utf-8") -> None:
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_bytes(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(path: str):
    """Yields a temporary directory that becomes ``path`` on success. ``path`` must not exist yet."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    if os.path.exists(path):
        raise FileExistsError(f"{path} already exists; refusing to overwrite it")
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(path)}.tmp-")
    try:
        yield tmp
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
