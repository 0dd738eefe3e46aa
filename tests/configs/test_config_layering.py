"""The generic dataclass <-> YAML code sits below the configs that use it: ``data/config.py`` and
``modeling/config.py`` import it from ``ce_retrieval.utils``, never from the ``configs`` package, which imports them."""

import ast
import pathlib

import pytest

import ce_retrieval
from ce_retrieval import configs
from ce_retrieval.utils import dataclass_yaml

ROOT = pathlib.Path(ce_retrieval.__file__).parent


def _imported_modules(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", ["data/config.py", "modeling/config.py", "utils/dataclass_yaml.py"])
def test_no_import_from_the_configs_package(module):
    upward = sorted(m for m in _imported_modules(ROOT / module) if m.split(".")[:2] == ["ce_retrieval", "configs"])
    assert not upward, f"{module} imports {upward} (the configs package imports it)"


def test_public_imports_keep_working():
    for name in ("ConfigError", "from_dict", "load_yaml", "merge", "parse_override", "save_yaml", "to_dict"):
        assert getattr(configs, name) is getattr(dataclass_yaml, name)
