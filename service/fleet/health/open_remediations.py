"""A node's open remediations (Node.remediations): read by the loader, built by the compiled page.

One predicate (remediations.OPEN) and one order (by id) for both, so the
dashboard's node list, answered by PostgreSQL (service/graphql/fast/node_pages.py),
lists what Strawberry's resolver lists.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import text

from service.database.connections import Connection
from service.fleet.health.remediations import COLUMNS, OPEN_SQL, Remediation, of_row

_OPEN = f"r.state IN {OPEN_SQL}"
_OF_NODES = text(
    f"SELECT {COLUMNS} FROM remediations r"
    f" WHERE r.node_id = ANY(CAST(:ids AS text[])) AND {_OPEN} ORDER BY r.node_id, r.id"
)


async def open_of(conn: Connection, node_ids: Sequence[str]) -> dict[str, list[Remediation]]:
    """Each node's open remediations (PENDING, IN_PROGRESS, AWAITING_VALIDATION), by id."""
    out: dict[str, list[Remediation]] = defaultdict(list)
    for r in await conn.execute(_OF_NODES, {"ids": list(node_ids)}):
        out[r.node_id].append(of_row(r))
    return out


def open_sql(n: str, entry: str) -> str:
    """SQL json: `entry` (over remediations `r`) for each open remediation of the node row `n`,
    as open_of lists them; [] for none. The compiled page's Node.remediations."""
    return (
        f"(SELECT coalesce(json_agg({entry} ORDER BY r.id), '[]')"
        f" FROM remediations r WHERE r.node_id = {n}.id AND {_OPEN})"
    )
