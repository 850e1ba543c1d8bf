"""The package layers: a module imports only from its own layer or lower ones (imports anywhere in
the module, function-local ones included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "areal_hpc"

# Lowest first. Components may use each other (the simulator drives the controller's scheduler);
# none of them may reach the rank wiring, a recipe or the command line above it.
LAYERS = [
    {"errors", "prompt_row", "config"},
    {"wire"},
    {"data", "reward", "trainer", "rollout", "metrics", "controller", "sim", "slurm", "evaluation"},
    {"recipes"},
    {"runtime"},
    {"cli", "launch"},
]


def layer_of(name: str) -> int:
    for i, members in enumerate(LAYERS):
        if name in members:
            return i
    raise AssertionError(f"areal_hpc.{name} is in no layer of tests/test_layering.py")


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "areal_hpc"]
        for name in names:
            parts = name.split(".")
            if parts[0] == "areal_hpc" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_module_imports_only_its_layer_or_lower():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.name == "__init__.py" and len(rel.parts) == 1:
            continue
        own = layer_of(rel.parts[0].removesuffix(".py"))
        for pkg in imported_packages(path):
            if layer_of(pkg) > own:
                bad.append(f"{rel} imports areal_hpc.{pkg}")
    assert bad == []


def test_the_wire_imports_no_component():
    for path in (PACKAGE / "wire").glob("*.py"):
        assert imported_packages(path) <= {"wire", "config", "errors"}, path
