"""ce_retrieval.utils.atomic, the one writer of artefacts: whole files or nothing, the final extension kept on the
temporary name, plain-open() permissions, and whole folders published with one rename."""

import os
import stat

import numpy as np
import pytest

from ce_retrieval.utils.atomic import atomic_directory, atomic_path, atomic_write_bytes, atomic_write_text


def _listing(folder):
    return sorted(os.listdir(folder))


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "sub" / "state.json"
    atomic_write_text(str(path), "old")
    with pytest.raises(RuntimeError), atomic_path(str(path)) as tmp:
        with open(tmp, "w") as f:
            f.write("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and _listing(path.parent) == ["state.json"]
    atomic_write_bytes(str(path), b"new")
    assert path.read_bytes() == b"new" and _listing(path.parent) == ["state.json"]


def test_temporary_name_keeps_the_extension_and_is_hidden(tmp_path):
    with atomic_path(str(tmp_path / "embeddings.npy")) as tmp:
        name = os.path.basename(tmp)
        assert name.startswith(".") and name.endswith(".npy")
        np.save(tmp, np.arange(3))  # np.save would append .npy to a name without it
    np.testing.assert_array_equal(np.load(tmp_path / "embeddings.npy"), np.arange(3))
    assert _listing(tmp_path) == ["embeddings.npy"]


def test_files_get_the_permissions_of_a_plain_open(tmp_path):
    # The copies this module replaced disagreed (mkstemp's owner-only 0600 vs open()'s 0666 & ~umask); the rule
    # is open()'s, so another user (a TF Serving process) reads an artefact like any other file.
    with open(tmp_path / "plain", "w") as f:
        f.write("x")
    atomic_write_text(str(tmp_path / "atomic"), "x")
    mode = lambda name: stat.S_IMODE(os.stat(tmp_path / name).st_mode)
    assert mode("atomic") == mode("plain")


def test_atomic_directory_publishes_whole_or_not_at_all(tmp_path):
    final = tmp_path / "index" / "1"
    with pytest.raises(ValueError), atomic_directory(str(final)) as tmp:
        atomic_write_text(os.path.join(tmp, "manifest.json"), "{}")
        raise ValueError("build failed")
    assert not final.exists() and _listing(tmp_path / "index") == []
    with atomic_directory(str(final)) as tmp:
        atomic_write_text(os.path.join(tmp, "manifest.json"), "{}")
    assert _listing(final) == ["manifest.json"] and _listing(tmp_path / "index") == ["1"]
    with pytest.raises(FileExistsError), atomic_directory(str(final)):
        pass
    with atomic_directory(str(final), overwrite=True) as tmp:
        atomic_write_text(os.path.join(tmp, "other.json"), "{}")
    assert _listing(final) == ["other.json"] and _listing(tmp_path / "index") == ["1"]
