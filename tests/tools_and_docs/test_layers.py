"""The layering the codebase promises: domain modules know nothing of HTTP or GraphQL, the agent nothing of the service."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("strawberry", "starlette")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_domain_modules_import_no_web_or_graphql_framework() -> None:
    offenders = {
        path.name: sorted(m for m in imported_modules(path) if m.split(".")[0] in FRAMEWORKS)
        for path in sorted((REPO / "service").glob("*.py"))
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_agent_imports_nothing_from_the_service() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(
            m for m in imported_modules(path) if m.split(".")[0] == "service"
        )
        for path in sorted((REPO / "agent").rglob("*.py"))
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}
