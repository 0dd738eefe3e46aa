"""The serving modules import one another one way: no import cycle, not even through a function-local import.

Every ``import`` / ``from ... import`` statement of every module under ``ce_retrieval/serving`` counts, wherever
it stands (module level, inside a function, under ``TYPE_CHECKING``): a cycle hidden in a function body is still
a cycle a reader has to untangle.
"""

import ast
import pathlib

import ce_retrieval.serving

PACKAGE = "ce_retrieval.serving"


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


def test_serving_has_no_import_cycle():
    graph = module_imports(pathlib.Path(ce_retrieval.serving.__file__).parent, PACKAGE)
    assert {"ce_retrieval.serving.service", "ce_retrieval.serving.shard_server"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in ce_retrieval/serving: " + " -> ".join(cycle)


def test_http_helpers_and_wire_format_sit_below_the_apps():
    """The shared HTTP helpers and the wire format import no app, router or searcher."""
    graph = module_imports(pathlib.Path(ce_retrieval.serving.__file__).parent, PACKAGE)
    apps = {f"{PACKAGE}.{m}" for m in ("service", "shard_server", "router", "searcher")}
    assert not graph[f"{PACKAGE}.http_app"] & apps
    assert not graph[f"{PACKAGE}.wire"] & apps
