"""The packages' layering, read from every module's import statements (docs/architecture.md):
``protocol/`` imports nothing of the project, ``session/`` no torch and no aiohttp, the server
never the model, the world no model, the clients only the protocol."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> what its modules must not import (worldserve subpackages by name, or modules)
FORBIDDEN: dict[str, set[str]] = {
    "protocol": {"session", "server", "model", "clients", "training", "world", "bench"},
    "session": {"server", "model", "clients", "training", "world", "bench", "torch", "aiohttp"},
    "server": {"model", "training", "world", "bench", "torch"},
    "world": {"model", "server", "session", "training", "bench", "torch"},
    "clients": {"session", "server", "model", "training", "world", "bench", "torch"},
}


def imported(path: Path) -> set[str]:
    """Every name a module imports: worldserve subpackages by name, others by top module."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            out.add(parts[1] if parts[0] == "worldserve" and len(parts) > 1 else parts[0])
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_only_what_its_layer_allows(package: str) -> None:
    wrong = {
        str(p.relative_to(ROOT)): sorted(imported(p) & FORBIDDEN[package])
        for p in sorted((ROOT / package).rglob("*.py"))
    }
    assert {k: v for k, v in wrong.items() if v} == {}
