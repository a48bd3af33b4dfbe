"""A filter on a related row found by its whole key: probed per row, never joined.

A page walks its driving index in order (nodes by id, pools by class and node)
and stops at its end; a filter such as "attached to fabric F" or "has a pool
of class C" is a row of another table whose whole primary key the walked row
and the request give. Written as EXISTS, PostgreSQL turns it into a join and
picks how by its row estimates: before the first ANALYZE (every table a
handful of rows) a nested loop that rescans every member of the fabric per
walked row, after it a merge join that reads the fabric's whole index. Both
read the cluster for a page of ten (tests/scheduling/test_page_costs.py).

Written as a scalar subquery on the key (`(SELECT true FROM t WHERE key = ...)
IS NOT NULL`), it stays a subplan the executor runs for each row the walk
reaches, and each run is one descent of the primary key: the page costs the
rows it walks whatever the statistics say. (PostgreSQL pulls EXISTS and IN up
into joins, and may hash an EXISTS it keeps; it does neither to a scalar
subquery.) The primary key makes the subquery return at most one row.
"""

from __future__ import annotations

from collections.abc import Mapping


def key_row_exists(table: str, key: Mapping[str, str]) -> str:
    """SQL: `table` has the row whose whole primary key is `key` (column -> SQL expression)."""
    alias = f"{table}_by_key"
    match = " AND ".join(f"{alias}.{column} = {value}" for column, value in key.items())
    return f"((SELECT true FROM {table} {alias} WHERE {match}) IS NOT NULL)"
