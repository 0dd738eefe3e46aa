"""The packages' imports point one way: search <- build <- serve, and evaluation sits beside build on search.

* ``search`` (exact and ScaNN search, threshold search, loaded indexes) imports neither ``build`` nor ``serve`` nor
  ``evaluation``: every other floor searches through it;
* ``build`` (export, index building, the Beam job) does not import ``serve``;
* ``evaluation`` imports ``search`` for its exact and ScaNN search, never ``build`` or ``serve``;
* inside each of the three packages there is no import cycle.

Every ``import`` / ``from ... import`` statement counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``): a link hidden in a function body is still a link a reader has to untangle.
"""

import ast
import pathlib

import pytest

import ce_retrieval

ROOT = pathlib.Path(ce_retrieval.__file__).parent
LAYERS = ("search", "build", "serve")


def module_imports(package_dir: pathlib.Path, package: str) -> dict[str, set[str]]:
    """Module name -> the modules of the same package it imports (``from pkg import mod`` names ``pkg.mod``)."""
    modules = {f"{package}.{p.stem}": p for p in package_dir.glob("*.py") if p.stem != "__init__"}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = node.module if node.level == 0 else f"{package}.{node.module}"
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None when the graph is acyclic (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once every descendant is explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_a_cycle_and_passes_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_module_imports_sees_function_local_and_from_package_imports(tmp_path):
    (tmp_path / "one.py").write_text("from pkg import two\n")
    (tmp_path / "two.py").write_text("def f():\n    from pkg.three import x\n")
    (tmp_path / "three.py").write_text("import pkg.one\nimport os\n")
    graph = module_imports(tmp_path, "pkg")
    assert graph == {"pkg.one": {"pkg.two"}, "pkg.two": {"pkg.three"}, "pkg.three": {"pkg.one"}}
    assert find_cycle(graph) == ["pkg.one", "pkg.two", "pkg.three", "pkg.one"]


def package_graph(package: str) -> dict[str, set[str]]:
    return module_imports(ROOT / package, f"ce_retrieval.{package}")


def imported_packages(package: str) -> dict[str, set[str]]:
    """Module of ``ce_retrieval.<package>`` -> the ``ce_retrieval`` sub-packages it imports from (any import)."""
    out = {}
    for path in sorted((ROOT / package).glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found.update(n.split(".")[1] for n in names if n.startswith("ce_retrieval.") and n.count(".") >= 1)
        out[f"ce_retrieval.{package}.{path.stem}"] = found
    return out


@pytest.mark.parametrize(
    "package, forbidden",
    [
        ("search", {"build", "serve", "evaluation", "serving"}),
        ("build", {"serve", "serving"}),
        ("evaluation", {"build", "serve", "serving"}),
    ],
)
def test_imports_point_down(package, forbidden):
    wrong = {m: sorted(p & forbidden) for m, p in imported_packages(package).items() if p & forbidden}
    assert not wrong, f"ce_retrieval.{package} imports from a floor above it: {wrong}"


@pytest.mark.parametrize("package", LAYERS)
def test_no_import_cycle_inside_a_package(package):
    graph = package_graph(package)
    assert graph, f"no modules found in ce_retrieval/{package}"
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle in ce_retrieval/{package}: " + " -> ".join(cycle)


def test_http_helpers_and_wire_format_sit_below_the_apps():
    """The shared HTTP helpers and the wire format import no app, router or searcher."""
    graph = package_graph("serve")
    apps = {f"ce_retrieval.serve.{m}" for m in ("service", "shard_server", "router", "searcher")}
    assert not graph["ce_retrieval.serve.http_app"] & apps
    assert not graph["ce_retrieval.serve.wire"] & apps
