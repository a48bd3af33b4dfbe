"""Every module under benchmarks/ imports: the ones run by hand too.

benchmarks/backups.py is run by hand (it needs Docker and 15 minutes), so
nothing in CI imported it, and when the tests' shared helpers moved to
tests/support/ its `from tests.reports import ...` broke unseen until the
next person ran it. mypy checks service, agent and the client only.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for path in (ROOT / "benchmarks").rglob("*.py")
    if path.name != "__main__.py"
)


def test_the_walk_finds_the_modules_run_by_hand() -> None:
    assert {"benchmarks.backups", "benchmarks.run", "benchmarks.equivalence.seed"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports(module: str) -> None:
    importlib.import_module(module)
