"""The exported schema is what agents and schedulers are written against: it must be current and keep the contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from graphql import build_schema
from graphql.utilities import find_breaking_changes

from service.graphql.schema import schema

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO.parent / "shared" / "contract.graphql"


def test_committed_schema_graphql_is_current() -> None:
    committed = (REPO / "schema.graphql").read_text()
    assert committed.strip() == schema.as_str().strip(), (
        "schema.graphql is stale: run "
        "`strawberry export-schema service.graphql.schema:schema -o schema.graphql`"
    )


def test_schema_keeps_every_name_of_the_contract() -> None:
    contract_text = (
        CONTRACT.read_text()
        if CONTRACT.exists()
        else (REPO / "tests" / "contract.graphql").read_text()
    )
    breaking = find_breaking_changes(build_schema(contract_text), build_schema(schema.as_str()))
    assert [f"{c.type.name}: {c.description}" for c in breaking] == []


def test_the_contract_copy_in_tests_matches_shared() -> None:
    # A copy lives in tests/ so the check runs where shared/ is absent; it
    # must not drift from the original.
    if CONTRACT.exists():
        assert (REPO / "tests" / "contract.graphql").read_text() == CONTRACT.read_text()


@pytest.mark.process
def test_export_schema_command_works() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "strawberry", "export-schema", "service.graphql.schema:schema"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "type Query" in out.stdout
