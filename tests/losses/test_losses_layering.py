"""The arrows inside ``ce_retrieval/losses`` point one way: the kernels (``losses/kernels/``) import no loss module,
and no module of the package imports itself back through others. Imports are read from the source, function-level
ones included, so a link hidden inside a function still counts."""

import ast
import pathlib

import ce_retrieval

LOSSES = pathlib.Path(ce_retrieval.__file__).parent / "losses"
PACKAGE = "ce_retrieval.losses"
#: what a kernel may import from ce_retrieval.losses besides the kernels: the relevance constants of the contract.
KERNEL_MAY_IMPORT = {f"{PACKAGE}.relevance"}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(LOSSES.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in LOSSES.rglob("*.py")}


def _imports(path: pathlib.Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, anywhere in the file (``from pkg import mod`` included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {name for name in found if name in known}


def _graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports; the package's own ``__init__`` (the public face, which imports
    every loss) is left out, as a child importing it would only reach the other children through it."""
    modules = _modules()
    known = set(modules) - {PACKAGE}
    return {name: _imports(path, known) - {name} for name, path in modules.items() if name != PACKAGE}


def test_kernels_import_no_loss_module():
    kernels = f"{PACKAGE}.kernels"
    graph = _graph()
    upward = {
        name: sorted(m for m in targets if not m.startswith(kernels) and m not in KERNEL_MAY_IMPORT)
        for name, targets in graph.items()
        if name.startswith(kernels)
    }
    assert len(upward) >= 6, sorted(upward)  # the kernels were found
    assert not {k: v for k, v in upward.items() if v}, upward


def test_no_import_cycle_inside_losses():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph.get(name, ())):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
