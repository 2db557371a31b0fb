"""The package layering docs/architecture.md states, checked on the source.

``middleware/`` depends on ``gateway/``; inside ``gateway/`` only the composition root
(``gateway/app.py``) names a middleware. No two modules import each other, directly or round a
longer circle, at module level (imports inside functions and under ``TYPE_CHECKING`` run later
and cannot deadlock a partial import), nor through any import at all. The circle checks cover
the benchmark (``bench/``) too: its scenarios import what they share from ``bench/common.py``
and ``bench/procs.py``, never from the entry point ``bench/run.py`` that imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "middleware", "client", "bench")
ROOT_MODULES_AT_MOST = 15
"""A small root: wiring, settings and the CLI; everything else lives in a package with one job."""
COMPOSITION_ROOT = "gateway.app"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imported(node: ast.Import | ast.ImportFrom, module: str, path: Path) -> set[str]:
    """The names an import statement brings in, resolved to absolute module paths."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return {base, *(f"{base}.{alias.name}" for alias in node.names)}


def _module_level_imports(module: str, path: Path) -> set[str]:
    """Project modules imported when ``module`` is imported (not in functions, not for typing)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= _imported(node, module, path)
        elif isinstance(node, ast.Try):
            for inner in node.body:
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    names |= _imported(inner, module, path)
    return {name for name in names if name in MODULES and name != module}


def _every_import(module: str, path: Path) -> set[str]:
    """Every module an import statement anywhere in ``module`` names, lazy ones included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= _imported(node, module, path)
    return names


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_modules_are_found() -> None:
    expected = {
        "gateway.app",
        "gateway.methods.exact.gate",
        "middleware.paid_access",
        "gateway.store",
        "bench.run",
        "bench.credit",
    }
    assert expected <= set(MODULES)


def test_only_the_composition_root_of_gateway_imports_middleware() -> None:
    importers = sorted(
        module
        for module, path in MODULES.items()
        if module.startswith("gateway")
        and any(name.split(".")[0] == "middleware" for name in _every_import(module, path))
    )

    assert importers == [COMPOSITION_ROOT]


def test_no_module_level_import_circle() -> None:
    graph = {module: _module_level_imports(module, path) for module, path in MODULES.items()}

    assert sum(len(edges) for edges in graph.values()) > 100  # the graph was really read
    assert _cycles(graph) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _every_import_in_tree(module: str, path: Path) -> set[str]:
    return {name for name in _every_import(module, path) if name in MODULES and name != module}


def test_no_import_circle_at_all_not_even_through_lazy_or_typing_imports() -> None:
    """A lazy import or one for typing only does not deadlock, but it still ties two modules
    together: neither can be read, moved or tested without the other."""
    graph = {module: _every_import_in_tree(module, path) for module, path in MODULES.items()}

    assert _cycles(graph) == []


def test_the_benchmark_entry_point_is_imported_by_no_module() -> None:
    """``bench/run.py`` runs as a script too (``python bench/run.py``): a module importing it
    would load a second copy of it beside ``__main__``."""
    importers = sorted(
        module for module, path in MODULES.items() if "bench.run" in _every_import_in_tree(module, path)
    )

    assert importers == []


def test_the_root_of_gateway_stays_small() -> None:
    root = sorted(path.name for path in (ROOT / "gateway").glob("*.py"))

    assert len(root) <= ROOT_MODULES_AT_MOST, root
