"""Import structure: the package's parts form no cycles (a newcomer can read them bottom-up), and
the serving runtime imports nothing of the operator, because what serving pods run is a copy of
runtime/ and contract.py alone, made by their init container (llm_operator/inject.py; the copy's
imports are checked with the standard library alone in test_inject.py)."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "llm_operator"
# What the serving runtime may use of this package: nothing that needs the operator's dependencies.
RUNTIME_MAY_IMPORT = {"contract", "runtime"}
OPERATOR_DEPENDENCIES = ("pydantic", "jinja2", "lightkube", "kopf", "yaml")


def part(module: str) -> str | None:
    """llm_operator.render.names -> render: the top-level subpackage or module it belongs to."""
    parts = module.split(".")
    return parts[1] if parts[0] == "llm_operator" and len(parts) > 1 else None


def parts_imported(path: Path) -> set[str]:
    """The parts a file imports, at any depth (function-level imports included)."""
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {part(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "llm_operator":  # import labels, contract
            found |= {part(f"llm_operator.{alias.name}") for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(part(node.module))
    return {p for p in found if p}


def graph() -> dict[str, set[str]]:
    """Part -> the other parts it imports."""
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        source = part(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        if source is None or source == "__init__":
            continue
        edges.setdefault(source, set()).update(parts_imported(path) - {source})
    return edges


def test_the_package_parts_import_each_other_without_cycles() -> None:
    edges = graph()
    assert {"api", "plan", "render", "modelrepo", "engine", "runtime", "controller", "contract"} <= set(edges)
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"an import cycle in llm_operator: {' -> '.join(e.args[1])}") from None


def test_the_runtime_and_the_contract_import_nothing_of_the_operator() -> None:
    edges = graph()
    assert edges["runtime"] <= RUNTIME_MAY_IMPORT, edges["runtime"] - RUNTIME_MAY_IMPORT
    assert edges["contract"] == set()


GUARD = f"""
import importlib, sys
FORBIDDEN = {OPERATOR_DEPENDENCIES!r}
class Guard:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ImportError(f"the serving runtime imported {{name}}")
sys.meta_path.insert(0, Guard())
for module in sys.argv[1:]:
    importlib.import_module(module)
"""


def test_the_launcher_imports_none_of_the_operators_dependencies() -> None:
    """Every runtime module but the CPU model (torch, Triton's python backend), in a fresh
    interpreter that refuses the operator's dependencies: the traceback names the importer."""
    modules = ["llm_operator.contract", "llm_operator.runtime.cpu_reference"] + [
        f"llm_operator.runtime.{p.stem}" for p in sorted((PACKAGE / "runtime").glob("*.py"))
    ]
    result = subprocess.run([sys.executable, "-c", GUARD, *modules], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "llm_operator.runtime.launcher" in modules
