"""Layers run one way: core <- slo, views, instrumentation, exporters <- dashboards,
reference stack <- cli. No import circles anywhere, a ``TYPE_CHECKING`` import aside.

Read from the source (every ``import``, lazy and type-checking ones included), not from
what happens to be imported at run time, so that an import added inside a function is
caught as well. The layers and their folders are described in docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FOLDERS = {
    "stagelens": ROOT / "stagelens",
    "stagelens.slo": ROOT / "stagelens" / "slo",
    "stagelens.metrics": ROOT / "stagelens" / "metrics",
    "stagelens.spans": ROOT / "stagelens" / "spans",
    "stagelens.views": ROOT / "stagelens" / "views",
    "stagelens.cli": ROOT / "stagelens" / "cli",
    "stagelens.instrumentation": ROOT / "instrumentation",
    "stagelens.exporters": ROOT / "exporters",
    "stagelens.dashboards": ROOT / "dashboards",
    "stagelens.reference": ROOT / "examples" / "gateway_vllm",
}
"""Import package -> the folder setuptools maps it from (pyproject ``package-dir``)."""

ENTRY = {"stagelens", "stagelens.testing"}
"""Modules outside ``stagelens.cli`` that wire the layers together for users: the package
facade and the public test helpers. They, and every module of ``stagelens.cli`` (the
console script and its subcommands), may import any layer."""

ALLOWED = {
    "core": {"core"},
    "slo": {"core", "slo"},
    "views": {"core", "views"},
    "instrumentation": {"core", "instrumentation"},
    "exporters": {"core", "exporters"},
    "dashboards": {"core", "slo", "dashboards"},
    "reference": {"core", "entry", "slo", "views", "instrumentation", "exporters", "reference"},
    "entry": {
        *("core", "entry", "slo", "views"),
        *("instrumentation", "exporters", "dashboards", "reference"),
    },
}
"""Which layers a layer may import. instrumentation and exporters never import each other;
the generators (slo), the views and the runtime never import the console script."""


def layer_of(module: str) -> str:
    """The layer a ``stagelens`` module belongs to."""
    if module in ENTRY or module == "stagelens.cli" or module.startswith("stagelens.cli."):
        return "entry"
    for package in ("slo", "views", "instrumentation", "exporters", "dashboards", "reference"):
        prefix = f"stagelens.{package}"
        if module == prefix or module.startswith(prefix + "."):
            return package
    return "core"


def modules() -> dict[str, Path]:
    """Every module of the installed namespace, by its import name."""
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in folder.glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """Import statements inside ``if TYPE_CHECKING:`` blocks (never run)."""
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(ast.walk(child))
    return skipped


def imported(module: str, path: Path, known: set[str], *, run_time_only: bool = False) -> set[str]:
    """The ``stagelens`` modules that ``module`` imports, wherever the import statement is
    (with ``run_time_only``, leaving out those under ``if TYPE_CHECKING:``)."""
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    targets: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree) if run_time_only else set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parents = parts[: len(parts) - node.level + 1]
                base = ".".join([*parents, base] if base else parents)
            for alias in node.names:
                # ``from stagelens import semconv`` imports the submodule, not the facade.
                child = f"{base}.{alias.name}"
                targets.add(child if child in known else base)
    return {t for t in targets if t == "stagelens" or t.startswith("stagelens.")}


def test_every_module_is_found() -> None:
    """The walk sees each layer's modules (a moved folder would otherwise pass silently)."""
    layers = {layer_of(name) for name in modules()}
    assert layers == set(ALLOWED)


@pytest.mark.parametrize("module", sorted(modules()))
def test_imports_run_one_way(module: str) -> None:
    """A module imports only from the layers its own layer may use."""
    found = modules()
    own = layer_of(module)
    wrong = sorted(
        target
        for target in imported(module, found[module], set(found))
        if layer_of(target) not in ALLOWED[own]
    )
    assert not wrong, f"{module} ({own}) imports {wrong}"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    """No two modules import each other, directly or through others, lazy imports included
    (a circle means two modules are one, or a third is missing); ``TYPE_CHECKING`` imports
    are left out, since they never run."""
    found = modules()
    graph = {
        name: imported(name, path, set(found), run_time_only=True) - {name}
        for name, path in found.items()
    }
    assert _circles(graph) == []


def test_circle_finder_sees_a_circle() -> None:
    """The circle check fails on a circle through a third module (it can fail)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
