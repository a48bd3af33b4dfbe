"""Fences and replica generations: which placement an engine runs, and which state of a replica a client saw.

A shard's fence is drawn from the one sequence shard_fence when the shard is
stored (its column default), so a placement made later on the same GPU
always carries a larger fence than the one before it, and an engine started
with an older fence can be told it was superseded (service/fleet/fencing.py).

A replica's generation is the largest coalesce(generation, fence) over its
shards (REPLICA_GENERATION): storing a shard raises it (a new fence), and a
change that leaves some of the replica's shards in place (a shard released,
a node removed) stamps them with a fresh value from the same sequence
(bump_generations). So every change of a replica's shards moves its
generation up, never back to a value a client saw before, and a replica
released and placed again under the same id starts above its old one. A
release naming another generation is refused with the current one
(allocations.release_replica), as OpenStack Placement refuses a consumer
generation that is not the current one.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text

from service.database.connections import Connection
from service.errors import InventoryError, shown

# SQL: the generation of the replica of shard alias `s` (one definition).
REPLICA_GENERATION = "(SELECT max(coalesce(x.generation, x.fence)) FROM shards x WHERE x.replica_id = {s}.replica_id)"


def replica_generation(alias: str) -> str:
    """SQL: the generation of the replica that the shard row `alias` belongs to."""
    return REPLICA_GENERATION.format(s=alias)


class GenerationConflict(InventoryError):
    """A client named a generation of a replica that is not the current one: nothing was changed."""

    code = "CONFLICT"

    def __init__(self, replica_id: str, named: int, current: int | None) -> None:
        now = "it holds no shards now" if current is None else f"its generation is {current}"
        super().__init__(
            f"replica '{shown(replica_id)}' changed since generation {named}: {now}; "
            "read it again and retry with the current generation"
        )
        self.replica_id = replica_id
        self.named = named
        self.current = current

    @property
    def extensions(self) -> dict[str, object]:
        return {
            "code": self.code,
            "replicaId": self.replica_id,
            "generation": self.named,
            "currentGeneration": self.current,
        }


_GENERATION = text(
    "SELECT max(coalesce(generation, fence)) FROM shards WHERE replica_id = :replica_id"
)


async def current_generation(conn: Connection, replica_id: str) -> int | None:
    """The replica's generation now; None when it holds no shard."""
    value: int | None = (await conn.execute(_GENERATION, {"replica_id": replica_id})).scalar()
    return value


_BUMP = text(
    """
    UPDATE shards SET generation = nextval('shard_fence')
    WHERE replica_id = ANY(CAST(:replica_ids AS text[]))
    """
)


async def bump_generations(conn: Connection, replica_ids: Sequence[str]) -> None:
    """The replicas lost some shards and kept others: their generation moves up.

    Run while holding the locks of the replicas' nodes (the writer that
    removed the shards holds them), so no other change of them interleaves.
    """
    if replica_ids:
        await conn.execute(_BUMP, {"replica_ids": sorted(set(replica_ids))})
