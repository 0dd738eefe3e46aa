"""Fixture of the modeling tests: a tiny WordPiece vocab file (helpers live in modeling_fixtures.py)."""

import pytest
from modeling_fixtures import VOCAB


@pytest.fixture(scope="session")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return str(path)
