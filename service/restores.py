"""What the inventory itself must do once its database was restored to an earlier moment.

A restore (deploy/restore.sh, docs/operations/backup.md) brings back the
database as it was at the target time T; everything acknowledged after T is
gone: allocations, releases, nodes' reports. The world did not go back: the
engines placed after T still run on their GPUs, with the fences they were
given. Two things keep that safe, and `llmgw-inventory after-restore` does
them in one transaction before the service takes traffic again:

- The fence sequence (shard_fence) moves past every fence the lost history
  can have issued. Restored, it stands where it stood at T, so the next
  placements would hand out again fences that engines placed after T still
  hold: fencing's promise (a later placement on a GPU always carries a larger
  fence) would break, and a heartbeat naming such a fence would be refused as
  "never issued" instead of being told to stop it. The old cluster's last
  value (read before it was stopped, when it could be) is the floor; a margin
  on top covers fences issued after that read, or everything after T when the
  old cluster could not be asked.
- An event `restored` says that a restore happened, to which time, and what
  the sequence did, so that the history a client reads explains the gap.

Then the nodes' agents bring the facts back with their next reports, and an
engine running a shard the restored inventory does not hold is answered in
shardsToStop (reason RELEASED; service/fleet/fencing.py): no GPU stays held
twice. The liveness sweep counts silence only from its first round after the
outage (service/fleet/liveness.py's Watch), so nodes whose last heartbeat
before T is old are not declared lost for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text

from service.database.connections import Connection
from service.errors import InvalidInput
from service.event_log.events import record_event

ACTOR = "restore"

# Fences handed out past the floor before the old cluster stopped, or by the
# whole lost history when it could not be asked: a million placements.
DEFAULT_FENCE_MARGIN = 1_000_000
# shard_fence is an integer sequence (service/tables.py).
FENCE_MAX = 2**31 - 1

_LAST_VALUE = text("SELECT last_value FROM shard_fence")
_SETVAL = text("SELECT setval('shard_fence', :value)")


@dataclass(frozen=True)
class AfterRestore:
    fence_before: int
    fence_after: int


async def after_restore(
    conn: Connection,
    target: str,
    fence_floor: int | None = None,
    margin: int = DEFAULT_FENCE_MARGIN,
) -> AfterRestore:
    """Move the fence sequence past the lost history and record the restore (caller's transaction)."""
    if target != "latest":
        try:
            datetime.fromisoformat(target.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInput("target", target, "neither 'latest' nor an ISO 8601 time") from None
    if margin < 1:
        raise InvalidInput("margin", margin, "at least 1")
    before = int((await conn.execute(_LAST_VALUE)).scalar_one())
    after = max(before, fence_floor or 0) + margin
    if after > FENCE_MAX:
        raise InvalidInput(
            "fence_floor",
            fence_floor,
            f"the fence sequence would pass its maximum {FENCE_MAX} ({before} + margin {margin})",
        )
    await conn.execute(_SETVAL, {"value": after})
    await record_event(
        conn,
        "restored",
        actor=ACTOR,
        reason=(
            f"the inventory was restored to {target}; what was acknowledged after it is gone, "
            f"and fences continue from {after + 1}"
        ),
        detail={
            "target": target,
            "fenceBefore": before,
            "fenceFloor": fence_floor,
            "fenceAfter": after,
        },
    )
    return AfterRestore(before, after)
