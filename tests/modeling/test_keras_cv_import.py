"""``import_keras_cv`` does not import torch: keras-cv's ``__init__`` imports it only to order it before TensorFlow,
which the towers' modules have already imported. The refusal is scoped to the block and leaves an imported torch
alone (its start-up saving per process is measured in ``benchmarks/scale/autograph_startup.py --change torch``)."""

import importlib
import sys
import types

import pytest

from ce_retrieval.modeling.image_tower import _torch_import_refused


def test_torch_cannot_be_imported_inside_the_block_only(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # restored after the test if this worker has it
    finders = list(sys.meta_path)
    with _torch_import_refused():
        with pytest.raises(ImportError, match="keras-cv"):
            importlib.import_module("torch")
        assert importlib.import_module("json.decoder").__name__ == "json.decoder"  # other imports go on
    assert sys.meta_path == finders and "torch" not in sys.modules


def test_an_imported_torch_is_left_as_it_is(monkeypatch):
    imported = types.ModuleType("torch")
    monkeypatch.setitem(sys.modules, "torch", imported)
    with _torch_import_refused():
        assert importlib.import_module("torch") is imported
