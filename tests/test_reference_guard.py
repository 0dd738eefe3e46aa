"""The conftest guard: a pinned reference package that is missing, unpinned or at another version is reported."""

import pathlib

import reference_packages


def test_every_reference_is_pinned_and_installed_here():
    assert reference_packages.problems() == []


def test_missing_unpinned_and_mismatched_references_are_reported(tmp_path: pathlib.Path):
    (tmp_path / "requirements.txt").write_text("numpy==0.0.1  # wrong on purpose\nno-such-dist==1.0\n")
    (tmp_path / "requirements-dev.txt").write_text("# comment\npytest==1.0\n")
    found = reference_packages.problems(
        {"numpy": "numpy", "no-such-dist": "no_such_module_xyz", "torch": "torch"}, root=tmp_path
    )
    assert len(found) == 3
    assert found[0].startswith("numpy: pinned 0.0.1, installed ")
    assert found[1] == "no-such-dist==1.0: module 'no_such_module_xyz' cannot be imported"
    assert found[2].startswith("torch: not pinned")
