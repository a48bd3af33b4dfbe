"""The documentation site builds with no broken link, and its schema reference is the exported schema's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from graphql import build_schema

from service.schema_reference import COMMAND, PAGE, SCHEMA, main, reference

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
    assert main(["--check", "--output", str(stale)]) == 1
    assert f"is stale: run `{COMMAND}`" in capsys.readouterr().err
    assert main(["--output", str(stale)]) == 0
    assert main(["--check", "--output", str(stale)]) == 0
