"""Arrows point one way around the objective: ``losses`` and ``utils`` import nothing from ``objective``,
``modeling`` or ``keras``; ``objective`` imports nothing from ``modeling`` or ``keras``; ``modeling`` reads no
loss class (the objective chooses the path from the losses' declared capabilities)."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "ce_retrieval"


def imported_modules(folder: str) -> dict[str, set[str]]:
    """``{file: {imported ce_retrieval modules}}`` for every file under ``ce_retrieval/folder`` (function-local
    imports included)."""
    found = {}
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(PACKAGE))] = {n for n in names if n.startswith("ce_retrieval")}
    return found


@pytest.mark.parametrize(
    "folder, forbidden",
    [
        ("losses", ("ce_retrieval.objective", "ce_retrieval.modeling", "ce_retrieval.keras")),
        ("utils", ("ce_retrieval.objective", "ce_retrieval.modeling", "ce_retrieval.losses")),
        ("objective", ("ce_retrieval.modeling", "ce_retrieval.keras", "ce_retrieval.tasks")),
    ],
)
def test_no_upward_imports(folder, forbidden):
    upward = {
        file: sorted(m for m in modules if m.startswith(forbidden))
        for file, modules in imported_modules(folder).items()
    }
    assert not {file: mods for file, mods in upward.items() if mods}


def test_the_model_reads_no_loss_class():
    modules = imported_modules("modeling")
    assert not [m for m in modules["modeling/two_tower.py"] if m.startswith("ce_retrieval.losses")]
    assert not [m for m in modules["modeling/grad_cache.py"] if m.startswith("ce_retrieval.losses")]
    source = (PACKAGE / "modeling" / "two_tower.py").read_text()
    for field in (".scale", ".cross_example", ".negative_fraction", ".top_k", "needs_gram", "_loss_from_embeddings"):
        assert f"loss{field}" not in source and f"loss_fn{field}" not in source, field
