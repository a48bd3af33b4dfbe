"""GraphQL of fencing: what an agent says its engines run, what it is told to stop, freeing held shards."""

from __future__ import annotations

from typing import Annotated

import strawberry

from service.database.connections import Connection
from service.fleet import fencing

from .context import Info

strawberry.enum(
    fencing.StopReason,
    name="StopReason",
    description=(
        "Why an engine must stop its shard: RELEASED (a scheduler released it), FREED_WHILE_LOST "
        "(freed because a node was lost), FENCE_SUPERSEDED (the inventory holds that shard id "
        "with another fence or on another node), TAINTED (a NO_EXECUTE taint on its GPUs or "
        "node that it does not tolerate, or whose tolerationSeconds ran out: the inventory "
        "still holds it until it is released), PREEMPTED (stopped to make room for a replica "
        "of higher priority, or reclaimed by a tenant below its guarantee: preemptedBy names it)."
    ),
)


@strawberry.input(
    description="A shard an engine on this node runs, with the fence it was started with."
)
class RunningShardInput:
    shard_id: strawberry.ID
    fence: int


@strawberry.type(
    description=(
        "A shard this node's engine must stop: the inventory does not hold it for this node "
        "with this fence, or a NO_EXECUTE taint says so (reason TAINTED)."
    )
)
class ShardToStop:
    shard_id: strawberry.ID
    fence: int
    reason: fencing.StopReason
    preempted_by: strawberry.ID | None = strawberry.field(
        default=None,
        description="The replica that preempted this shard's replica (reason PREEMPTED).",
    )

    @classmethod
    def of(cls, stop: fencing.ShardToStop) -> ShardToStop:
        return cls(
            shard_id=strawberry.ID(stop.shard_id),
            fence=stop.fence,
            reason=stop.reason,
            preempted_by=None if stop.preempted_by is None else strawberry.ID(stop.preempted_by),
        )


def contact_of(
    incarnation: int | None, running_shards: list[RunningShardInput] | None
) -> fencing.Contact:
    return fencing.Contact(
        incarnation=incarnation,
        running=None
        if running_shards is None
        else tuple(fencing.RunningShard(str(r.shard_id), r.fence) for r in running_shards),
    )


INCARNATION_DESCRIPTION = (
    "The node's incarnation this agent last saw (Node.incarnation); one newer than the "
    "service's is refused (BAD_INPUT) and recorded as a future_incarnation event."
)
RUNNING_SHARDS_DESCRIPTION = (
    "The shards this node's engines run, each with its fence. The answer's "
    "Node.shardsToStop lists those the inventory does not hold for this node with that fence; "
    "under INVENTORY_LOST_POLICY=hold it also confirms held shards (docs/operations/fencing.md)."
)

# The two arguments registerNode and heartbeat both take, described once.
IncarnationArgument = Annotated[
    int | None, strawberry.argument(description=INCARNATION_DESCRIPTION)
]
RunningShardsArgument = Annotated[
    list[RunningShardInput] | None, strawberry.argument(description=RUNNING_SHARDS_DESCRIPTION)
]


@strawberry.type
class FencingMutations:
    @strawberry.mutation(
        description=(
            "Operator: free the replicas held for a node lost under INVENTORY_LOST_POLICY=hold, "
            "whole (their GPUs are offered again, their engines told FREED_WHILE_LOST). Returns "
            "GPUs freed."
        )
    )
    async def free_held_shards(self, info: Info, node_id: strawberry.ID, reason: str) -> int:
        async def work(conn: Connection) -> int:
            return await fencing.free_held(conn, str(node_id), info.context.actor, reason)

        return await info.context.write(work)
