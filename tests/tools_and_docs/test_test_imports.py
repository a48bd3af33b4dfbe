"""No test module imports from another test module or a conftest: what tests share lives in tests/support/.

Importing a test module runs its module-level setup (and, imported by name,
its tests are collected twice where a star or a fixture import drags them
in); importing a conftest by path makes a second copy of it beside the one
pytest loaded, so its classes exist twice and `isinstance` and
`pytest.raises` quietly disagree. Both happened here (51 imports reached into
other test modules). tests/support/ is the one home of what several modules use.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def forbidden(module: str) -> bool:
    """A test module (test_*) or a conftest, written as a dotted module name."""
    parts = module.split(".")
    return parts[0] == "tests" and (parts[-1].startswith("test_") or parts[-1] == "conftest")


def imports_of(path: Path, tests: Path = TESTS) -> list[tuple[int, str]]:
    """(line, module) of every import in `path` (a file under `tests`), relative ones resolved."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(tests.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from tests.scheduling import test_place` names the test module as a name.
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return found


def test_no_module_under_tests_imports_a_test_module_or_a_conftest() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}: imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, module in imports_of(path)
        if forbidden(module)
    ]
    assert not found, (
        "move what is shared to tests/support/ and import it from there:\n" + "\n".join(found)
    )


def test_the_scan_sees_every_way_of_writing_such_an_import(tmp_path: Path) -> None:
    """The check above would pass on a tree it cannot read: it must see each form."""
    written = {
        "from tests.scheduling.test_place import register": True,
        "import tests.fleet.test_liveness": True,
        "from tests.conftest import Api": True,
        "from tests.agent.conftest import Dcgmi": True,
        "from tests.scheduling import test_place": True,
        "from .test_place import register": True,
        "from . import conftest": True,
        "from tests.support.placing import register": False,
        "from service.scheduling import placement": False,
    }
    for source, bad in written.items():
        path = tmp_path / "tests" / "scheduling" / "test_example.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source + "\n")
        modules = [m for _, m in imports_of(path, tmp_path / "tests")]
        assert any(forbidden(m) for m in modules) is bad, (source, modules)
