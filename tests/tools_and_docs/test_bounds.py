"""The bounds on what the service accepts have one home (service/bounds.py), read by the checks and the schema.

A bound assigned a second time, or an id length written out in a CHECK,
would let the Python check and the database's disagree: the scan below names
the file and the line. And at the bound itself, the API and the database
draw the line at the same length.
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from service import bounds
from tests.support.api import Api
from tests.support.one_definition import ROOT, second_definitions
from tests.support.reports import REGISTER, node_input

HOME = ROOT / "service" / "bounds.py"
NAMES = sorted(name for name in vars(bounds) if name.startswith("MAX_"))

SECOND_DEFINITIONS = {
    "a bound assigned again": re.compile(rf"^\s*({'|'.join(NAMES)})\s*(:[^=]*)?=(?!=)"),
    "an id length written out": re.compile(
        rf"char_length\(\w+\)\s+BETWEEN\s+1\s+AND|\b{bounds.MAX_ID_LENGTH}\b"
    ),
}


def test_bounds_are_defined_in_one_place() -> None:
    found = second_definitions(HOME, SECOND_DEFINITIONS)
    assert not found, "define it in service/bounds.py and read it from there:\n" + "\n".join(found)


def test_the_scan_would_see_the_definitions_it_forbids() -> None:
    # The forms the bounds were once written in: fleet/reports.py's constants,
    # allocations' MAX_SHARDS, topology's domain length, tables.ID_CHECK.
    old_forms = {
        "a bound assigned again": [
            "MAX_ID_LENGTH = 253",
            "MAX_SHARDS = 64",
            "MAX_DOMAIN_LENGTH = 253",
            "MAX_GPUS_PER_SHARD: Final = MAX_GPUS",
        ],
        "an id length written out": [
            'ID_CHECK = "char_length({col}) BETWEEN 1 AND 253"',
            "if len(value) > 253:",
        ],
    }
    for what, lines in old_forms.items():
        for line in lines:
            assert SECOND_DEFINITIONS[what].search(line), (what, line)
    assert not SECOND_DEFINITIONS["a bound assigned again"].search("if MAX_GPUS == 8:")
    assert SECOND_DEFINITIONS["an id length written out"].search(bounds.id_length_check("id"))


async def test_the_api_and_the_database_refuse_an_id_at_the_same_length(
    api: Api, engine: AsyncEngine
) -> None:
    longest = "n" * bounds.MAX_ID_LENGTH
    # A short hostname: it has a bound of its own.
    registered = await api(REGISTER, {"input": node_input(longest, hostname="n.local")})
    assert registered["registerNode"]["id"] == longest

    error = await api.fails(REGISTER, {"input": node_input(longest + "n", hostname="n.local")})
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == "input.id"
    assert str(bounds.MAX_ID_LENGTH) in error["message"]

    # The database's CHECK (built from the same bound) draws the same line.
    async with engine.connect() as conn:
        with pytest.raises(IntegrityError, match="ck_nodes_id_length"):
            await conn.execute(
                text("UPDATE nodes SET id = :longer WHERE id = :id"),
                {"longer": longest + "n", "id": longest},
            )
