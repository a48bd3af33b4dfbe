"""The documentation site builds with no broken link, and its schema reference is the exported schema's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from graphql import build_schema

from service.schema_reference import COMMAND, PAGE, ROLES_PAGE, SCHEMA, main, reference, roles

REPO = Path(__file__).resolve().parents[2]
MKDOCS = shutil.which("mkdocs", path=str(Path(sys.executable).parent))


@pytest.mark.process
@pytest.mark.skipif(
    MKDOCS is None, reason="mkdocs-material is in the dev extras: pip install -e .[dev]"
)
def test_mkdocs_builds_the_site_strictly(tmp_path: Path) -> None:
    assert MKDOCS is not None
    done = subprocess.run(
        [MKDOCS, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "reference" / "schema" / "index.html").exists()
    assert (tmp_path / "site" / "security" / "tokens" / "index.html").exists()


def test_the_schema_reference_is_generated_from_the_exported_schema() -> None:
    assert PAGE.read_text() == reference(build_schema(SCHEMA.read_text())), (
        f"{PAGE.relative_to(REPO)} is stale: run `{COMMAND}`"
    )


def test_the_role_table_is_generated_from_the_one_the_service_enforces() -> None:
    """docs/security/roles.md's table is ROOT_FIELD_ROLES over the exported schema's root fields
    (issue 44: the page said a reader may call every query; three queries refused one)."""
    page = ROLES_PAGE.read_text()
    assert page == roles(build_schema(SCHEMA.read_text()), page), (
        f"{ROLES_PAGE.relative_to(REPO)} is stale: run `{COMMAND}`"
    )
    assert "| `reader` | `reader`, `scheduler`, `operator` | queries: `allocations`," in page


def test_the_reference_carries_the_schemas_descriptions() -> None:
    page = PAGE.read_text()
    # A field's description, an argument, an enum value, an input's default.
    assert "Whether place would succeed now and, per node, the first check that fails." in page
    assert "- `first`: [Int](#int)" in page
    assert "### NodeState" in page and "- `CORDONED`" in page
    assert "- **`warning`**: [String](#string)<br>Set when this token put tokens in force" in page


def test_check_says_stale_and_names_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "schema.md"
    stale.write_text("# old\n")
    role_page = tmp_path / "roles.md"
    old_table = "| a field that needs | may be called by | fields |\n| `reader` | nobody | |\n"
    role_page.write_text(roles(build_schema(SCHEMA.read_text()), ROLES_PAGE.read_text()))
    pages = ["--output", str(stale), "--roles", str(role_page)]
    assert main(["--check", *pages]) == 1
    assert f"{stale} is stale: run `{COMMAND}`" in capsys.readouterr().err
    assert main(pages) == 0
    assert main(["--check", *pages]) == 0
    role_page.write_text(role_page.read_text().replace("| `reader` |", old_table, 1))
    assert main(["--check", *pages]) == 1
    assert f"{role_page} is stale" in capsys.readouterr().err
