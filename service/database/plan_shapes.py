"""Statement shapes whose plan does not depend on the planner's statistics.

A scheduler-facing page must cost what the page holds, on a cluster just
registered (no ANALYZE yet: every table guessed at a handful of rows) as
after ANALYZE (issue 30). Where PostgreSQL has a choice of plans, it picks
by row estimates, and the estimates are what is missing or wrong in the
first case: it sorted every pool of a class to keep a hundred, rescanned a
fabric's members for every pool walked, hashed every shard for one node's
GPUs. So the statements that build pages take the choice away with the
shapes here, rather than with planner settings (enable_*), which would bend
every other plan of the statement too. This module is their one home;
tests/scheduling/test_page_costs.py checks every page in both states.

- ordered_walk: rows of an index in order, one descent per row (a recursive
  CTE whose step is `ORDER BY key LIMIT 1`, which PostgreSQL answers from
  the index in any statistics state). The caller's LIMIT stops the
  recursion, so a page reads its own rows and the rows it skips.
- key_row_exists: a filter on a related row whose whole primary key the
  walked row and the request give (attached to fabric F, has a pool of class
  C). As EXISTS, PostgreSQL makes it a join chosen by estimates; as a scalar
  subquery on the key it stays a subplan run per walked row, one primary-key
  descent each. (PostgreSQL pulls EXISTS and IN up into joins, and may hash
  an EXISTS it keeps; it does neither to a scalar subquery.)
- leading_key_is: a page in index order under an equality on the index's
  leading column (a class's pools in node order). Written as `=`, the
  planner may take the order from any index that has the other column
  first (the primary key (node, class)) and filter the rest, which walks
  every pool of every class, the full ones too; written as `= ANY` of a
  one-element array with the column first in the ORDER BY, the order is
  only the leading-column index's, and the rival is a sort.
- distinct_keys: the distinct values of several leading columns of an
  index, one descent per value (a recursive CTE whose step is `ORDER BY
  key LIMIT 1` after a row comparison, which btree answers from the index
  in any statistics state): a count over a class's pools that costs what
  the kinds of pool cost, not the pools.
- unseen_limit: a page's LIMIT given as a value the planner cannot read (a
  one-row subquery), so that it plans for the first tenth of the rows: in
  any statistics state, the walk of an index in the page's order, which
  stops at the page, rather than a read of every match and a sort. Written
  as a number (or a parameter, which a custom plan reads), a page of 1,000
  on a table never analyzed nor vacuumed is planned for the handful of
  matches the planner guesses, all of them, and a bitmap scan and a sort
  of every one (every pool of a class, for each page) costs less than an
  index walk whose rows it believes each need a heap fetch.
- key_row: a related row whose columns the page shows (a verdict's node
  and pool), joined LATERAL behind OFFSET 0, which PostgreSQL does not
  flatten into the outer join: a primary-key descent per row. Only for a
  table that grows with the cluster: on a table of a few pages the planner
  scans it once per row instead, which is cheaper there and is what a plain
  join's hash would read once (shards, on a cluster with few allocations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def ordered_walk(
    name: str, table: str, column: str, where: str, start: str, leading: str | None = None
) -> str:
    """SQL: a recursive CTE `name(column)`, for a `WITH RECURSIVE`.

    The values of `column` in `table`'s rows (alias `t`) that match `where`,
    ascending, from after `start`, each found by one descent of an index
    that has `column` in order after the columns `where` fixes; then one
    NULL row. Read it with `WHERE column IS NOT NULL` and a LIMIT: the
    recursion runs only as far as the LIMIT reads it. `leading`: a column
    `where` fixes with leading_key_is, put first in the ORDER BY so that
    only the index it leads gives the order.
    """
    order = f"t.{column}" if leading is None else f"t.{leading}, t.{column}"

    def step(after: str) -> str:
        return (
            f"(SELECT t.{column} FROM {table} t WHERE {where} AND t.{column} > {after}"
            f" ORDER BY {order} LIMIT 1)"
        )

    return (
        f"{name}({column}) AS (SELECT {step(start)} UNION ALL"
        f" SELECT {step(f'{name}.{column}')} FROM {name} WHERE {name}.{column} IS NOT NULL)"
    )


def distinct_keys(
    name: str,
    table: str,
    columns: Sequence[str],
    where: str,
    leading: Sequence[str] = (),
    start: str = "true",
) -> str:
    """SQL: a recursive CTE `name(columns...)`, for a `WITH RECURSIVE`.

    Each distinct tuple of `columns` among `table`'s rows (alias `t`) that
    match `where`, ascending, found by one descent of an index whose key
    starts with `leading` (the columns `where` fixes by equality) and then
    `columns`, in that order: the step is a row comparison with the tuple
    found last, which btree takes as an index condition. The columns must
    be NOT NULL (a NULL in a row comparison compares as unknown). A LIMIT on
    the reader stops the recursion. `start`: where the first descent goes (a
    row comparison on leading `columns`, `>=` the first tuple wanted), which
    the later ones, after the tuple found last, need not repeat: beside
    their own row comparison, a second condition on those columns would
    keep btree from starting at it.
    """
    listed = ", ".join(f"t.{c}" for c in columns)
    order = ", ".join(f"t.{c}" for c in (*leading, *columns))
    last = ", ".join(f"k.{c}" for c in columns)

    def step(after: str) -> str:
        return f"SELECT {listed} FROM {table} t WHERE {where} AND {after} ORDER BY {order} LIMIT 1"

    return (
        f"{name}({', '.join(columns)}) AS (({step(start)}) UNION ALL SELECT n.* FROM {name} k"
        f" CROSS JOIN LATERAL ({step(f'({listed}) > ({last})')}) n)"
    )


def leading_key_is(column: str, value: str, cast: str = "text") -> str:
    """SQL: `column` equals `value`, for a statement that also orders by `column` first."""
    return f"{column} = ANY(ARRAY[CAST({value} AS {cast})])"


def unseen_limit(count: str) -> str:
    """SQL: `LIMIT count`, planned as a fast start whatever `count` (an integer expression) is."""
    return f"LIMIT (SELECT CAST({count} AS bigint))"


def key_row_exists(table: str, key: Mapping[str, str]) -> str:
    """SQL: `table` has the row whose whole primary key is `key` (column -> SQL expression)."""
    alias = f"{table}_by_key"
    match = " AND ".join(f"{alias}.{column} = {value}" for column, value in key.items())
    return f"((SELECT true FROM {table} {alias} WHERE {match}) IS NOT NULL)"


def key_row(table: str, alias: str, key: Mapping[str, str]) -> str:
    """SQL: `LEFT JOIN` of `table` as `alias`, the row whose whole primary key is `key`.

    Every column of `alias` is null where there is no such row, as in a
    plain LEFT JOIN on the key.
    """
    match = " AND ".join(f"k.{column} = {value}" for column, value in key.items())
    return f"LEFT JOIN LATERAL (SELECT k.* FROM {table} k WHERE {match} OFFSET 0) {alias} ON true"
