"""docs/internals/data-model.md maps every table PostgreSQL keeps, and no table that is not.

The page is the map of the schema (service/tables.py, with fleet health's
tables in service/health_tables.py and tenancy's in service/tenancy_tables.py, on the same
metadata). A table added
without a row there, or a row left behind by a dropped or renamed table,
fails here, so the map stays the schema's.
"""

from __future__ import annotations

import re
from pathlib import Path

from service import (  # noqa: F401 (their tables join the metadata)
    health_tables,
    maintenance_tables,
    reservation_tables,
    tenancy_tables,
)
from service.tables import metadata

PAGE = Path(__file__).resolve().parents[2] / "docs" / "internals" / "data-model.md"


def mapped_tables(page: str) -> list[str]:
    """The first cell of each row of the page's table of tables: | `name` | one row per | ... |."""
    return re.findall(r"^\| `(\w+)` \|[^|]+\|[^|]+\|\s*$", page, flags=re.M)


def test_every_table_has_its_row_and_every_row_a_table() -> None:
    mapped = mapped_tables(PAGE.read_text())
    assert len(mapped) == len(set(mapped)), "a table with two rows"
    tables = set(metadata.tables)
    assert sorted(tables - set(mapped)) == [], "tables missing from data-model.md"
    assert sorted(set(mapped) - tables) == [], "rows of data-model.md naming no table"


def test_the_rows_are_read_as_a_reader_reads_them() -> None:
    page = (
        "| table | one row per | what it holds |\n| --- | --- | --- |\n"
        "| `nodes` | node | its report |\n| `gpus` | GPU | a `taints` mark |\n"
        "Not a row: | `shards` |\n"
    )
    assert mapped_tables(page) == ["nodes", "gpus"]
