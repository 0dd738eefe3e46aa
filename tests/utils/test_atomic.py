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


def test_a_killed_writers_temporary_folder_is_removed_by_the_next_writer(tmp_path):
    # A SIGKILL runs no clean-up, so the folder a killed writer was filling stays; the next writer of the same
    # place removes it. A live writer's folder, another host's, and names this module did not make stay.
    import signal
    import subprocess
    import sys
    import textwrap

    from ce_retrieval.utils.atomic import _host_tag, temp_dir_for

    final = tmp_path / "index" / "3"
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from ce_retrieval.utils.atomic import atomic_directory
        with atomic_directory({str(final)!r}) as tmp:
            open(os.path.join(tmp, "embeddings.npy"), "wb").write(b"half")
            print(tmp, flush=True)
            time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    killed_tmp = proc.stdout.readline().strip()
    live = temp_dir_for(str(tmp_path / "index" / "4"))  # ours: this process is alive
    os.makedirs(live)
    other_host = tmp_path / "index" / f".tmp-5-{'0' * 8 if _host_tag() != '0' * 8 else '1' * 8}-1-abcdef12"
    other_host.mkdir()
    unrelated = tmp_path / "index" / ".tmp-notes"
    unrelated.mkdir()
    assert os.path.isdir(killed_tmp)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert os.path.isdir(killed_tmp) and not final.exists()
    with atomic_directory(str(final)) as tmp:
        open(os.path.join(tmp, "embeddings.npy"), "wb").write(b"whole")
    assert not os.path.exists(killed_tmp)
    assert sorted(os.listdir(tmp_path / "index")) == sorted(
        ["3", os.path.basename(live), other_host.name, ".tmp-notes"]
    )
    assert (final / "embeddings.npy").read_bytes() == b"whole"
