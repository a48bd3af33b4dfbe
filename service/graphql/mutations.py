"""The agent's and the operator's mutations. One transaction each, opened here."""

from __future__ import annotations

import strawberry

from service import metrics
from service.database.connections import Connection
from service.errors import NodeNotFound
from service.fleet import heartbeats, node_views, nodes, observed_at, re_registration
from service.fleet.node_views import NodeRecord
from service.fleet.reports import NodeReport, settle_observed_at

from .context import Context, Info
from .inputs import NodeInput
from .types import Node

# The keys of a beat's and a report's outcome in Context.handed_over: the
# field and the node id.
HEARTBEAT = "heartbeat"
REGISTER = "registerNode"


async def store_report(context: Context, report: NodeReport) -> NodeRecord:
    """registerNode's write, for its resolver and its compiled route: the node as stored.

    One statement or one transaction (service/fleet/re_registration.py); the XIDs
    it carried are counted once it committed.
    """
    # Its observedAt times on the service's clock (service/fleet/observed_at.py),
    # judged at receipt.
    clock = observed_at.agent_clock(None, observed_at.now(), context.settings.clock_skew)
    report = settle_observed_at(report, clock)
    registration = await re_registration.register(context.engine, report, context.actor)
    metrics.count_xids((x.gpu_class, x.xid) for x in registration.xids)
    # The row as the upsert returned it: one round trip fewer.
    return registration.node


async def _read_back(conn: Connection, node_id: str) -> NodeRecord:
    record = await node_views.get_node(conn, node_id)
    if record is None:
        raise NodeNotFound(node_id)
    return record


@strawberry.type
class NodeMutations:
    @strawberry.mutation(
        description="Agent: create or replace a node's report. An operator's cordon or drain survives it."
    )
    async def register_node(self, info: Info, input: NodeInput) -> Node:
        report = input.to_report()
        context = info.context
        # Once per request: a compiled registerNode that declined after
        # storing hands its outcome over (service/graphql/fast/compiled_registration.py).
        return Node.of(
            await context.once((REGISTER, report.id), lambda: store_report(context, report))
        )

    @strawberry.mutation(
        description=(
            "Agent: I am alive. Brings an unreachable or lost node back to ready; errors for an "
            "unknown node (code NODE_NOT_FOUND) so the agent re-registers."
        )
    )
    async def heartbeat(self, info: Info, node_id: strawberry.ID) -> Node:
        # Batched with this process's concurrent heartbeats: one transaction
        # for many (service/fleet/heartbeats.py); the reply waits for its commit.
        # Once per request: a compiled heartbeat that declined after beating
        # hands its outcome over (service/graphql/fast/compiled_heartbeat.py).
        context = info.context
        beat = await context.once(
            (HEARTBEAT, str(node_id)), lambda: heartbeats.beat(context.engine, str(node_id))
        )
        # The beat returns the node's state only (node_views.BeatRecord):
        # the rest of the node as it is now, read after the beat committed.
        record: NodeRecord | None = await context.loaders.node.load(beat.id)
        if record is None:
            raise NodeNotFound(beat.id)
        return Node.of(record)

    @strawberry.mutation
    async def cordon_node(self, info: Info, id: strawberry.ID, reason: str) -> Node:
        async def work(conn: Connection) -> NodeRecord:
            await nodes.cordon_node(conn, str(id), reason, info.context.actor)
            return await _read_back(conn, str(id))

        return Node.of(await info.context.write(work))

    @strawberry.mutation
    async def drain_node(self, info: Info, id: strawberry.ID, reason: str) -> Node:
        async def work(conn: Connection) -> NodeRecord:
            await nodes.drain_node(conn, str(id), reason, info.context.actor)
            return await _read_back(conn, str(id))

        return Node.of(await info.context.write(work))

    @strawberry.mutation
    async def uncordon_node(self, info: Info, id: strawberry.ID) -> Node:
        async def work(conn: Connection) -> NodeRecord:
            await nodes.uncordon_node(conn, str(id), info.context.actor)
            return await _read_back(conn, str(id))

        return Node.of(await info.context.write(work))

    @strawberry.mutation(description="Forget a node and its allocations.")
    async def remove_node(self, info: Info, id: strawberry.ID) -> bool:
        async def work(conn: Connection) -> bool:
            return await nodes.remove_node(conn, str(id), info.context.actor)

        return await info.context.write(work)
