"""Transitions on time: state changes due at a moment, made once whichever service process is up.

Issue 47: a reservation becomes ACTIVE at its start and ENDED at its end, a
maintenance window DRAINING at start - drainLead, and so on, whether or not
anyone calls the API then. Every service process runs run_timeline(), a loop
that asks each registered Transition for what is due (by the database's
clock) and makes each due item in a transaction of its own. A Transition's
`make` takes the locks it needs, then changes the row with a conditional
UPDATE (WHERE state = <old> AND <due> <= now()) and writes its event in the
same transaction: when two processes find the same item due, the second's
UPDATE waits for the first's row lock, re-checks its WHERE on the committed
row and changes nothing, so the change and its event happen exactly once
(tests/scheduling/test_reservations_concurrency.py runs two processes).

Reservations register theirs in service/scheduling/reservations/. Maintenance
windows make theirs as a Sweep: one transaction per look that takes an
advisory lock (or skips while another process holds it) and claims every due
change with conditional UPDATEs (service/fleet/maintenance/transitions.py),
because a window's waves must look at all its deployments together. One loop
per process runs both (service/web/operations.py), at
INVENTORY_TIMELINE_INTERVAL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncEngine

from service.database.connections import Connection
from service.database.db_faults import is_database_unavailable
from service.database.transactions import in_transaction

log = logging.getLogger(__name__)

# How many due items one round makes of one transition at most: a backlog
# (after an outage) is worked off a batch per round, never in one transaction.
BATCH = 100


@dataclass(frozen=True)
class Transition:
    """One kind of state change on time.

    `due`: a statement with a :limit parameter returning the ids (column `id`)
    of items due now, by the database's clock; read without locks, so it may
    name an item another process is making this moment. `make(conn, id)`:
    in its own transaction, makes the change if it is still due (conditional
    UPDATE) with its event; answers whether it made it.
    """

    name: str
    due: TextClause
    make: Callable[[Connection, Any], Awaitable[bool]]


@dataclass(frozen=True)
class Sweep:
    """A kind of change on time made whole in one transaction per look.

    `run(conn)` makes whatever is due inside the caller's transaction (never
    commits), taking its own locks so that each change happens once;
    `said(result)` words what it did for the log after the commit, None when
    it did nothing.
    """

    name: str
    run: Callable[[Connection], Awaitable[Any]]
    said: Callable[[Any], str | None]


async def run_due(engine: AsyncEngine, transitions: Sequence[Transition]) -> int:
    """Every transition's due items, each made in a transaction of its own; how many were made."""
    made = 0
    for transition in transitions:

        async def due(conn: Connection, t: Transition = transition) -> list[Any]:
            return [r.id for r in await conn.execute(t.due, {"limit": BATCH})]

        for item in await in_transaction(engine, due):

            async def make(conn: Connection, t: Transition = transition, i: Any = item) -> bool:
                return await t.make(conn, i)

            if await in_transaction(engine, make):
                made += 1
    return made


async def run_sweeps(engine: AsyncEngine, sweeps: Sequence[Sweep]) -> None:
    """Each sweep in a transaction of its own; what one did is logged once it committed."""
    for sweep in sweeps:
        result = await in_transaction(engine, sweep.run)
        words = sweep.said(result)
        if words is not None:
            log.info("%s: %s", sweep.name, words)


async def run_timeline(
    engine: AsyncEngine,
    transitions: Sequence[Transition],
    *,
    sweeps: Sequence[Sweep] = (),
    interval: float,
) -> None:
    """Make what is due every `interval` seconds until cancelled; a failed look is logged and retried.

    Each kind is looked at apart (the transitions, then each sweep), so one
    that keeps failing never keeps another from happening on time.
    """
    # (name, the sweep looked at; None: the transitions)
    looks: list[tuple[str, Sweep | None]] = [
        ("transitions", None),
        *((each.name, each) for each in sweeps),
    ]
    while True:
        for name, sweep in looks:
            try:
                if sweep is None:
                    await run_due(engine, transitions)
                else:
                    await run_sweeps(engine, [sweep])
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if is_database_unavailable(error):
                    log.warning(
                        "timeline (%s): database unavailable (%s); retrying in %.1fs",
                        name,
                        str(error).splitlines()[0] if str(error) else type(error).__name__,
                        interval,
                    )
                else:
                    log.exception("timeline (%s) failed; retrying in %.1fs", name, interval)
        await asyncio.sleep(interval)
