"""Fixtures of the task tests: the modeling tests' tiny vocabulary, batch and model config."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "modeling"))
from modeling_fixtures import VOCAB  # noqa: E402


@pytest.fixture(scope="session")
def task_vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return str(path)
