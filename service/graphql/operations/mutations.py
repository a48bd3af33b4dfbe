"""The agent's and the operator's mutations. One transaction each, opened here."""

from __future__ import annotations

import strawberry

from service import metrics
from service.database.connections import Connection
from service.errors import NodeNotFound
from service.fleet import fencing, heartbeats, node_reads, node_writes, observed_at, re_registration
from service.fleet.node_reads import BeatRecord, NodeRecord
from service.fleet.reports import NodeReport, settle_observed_at

from ..context import Context, Info
from ..fencing_types import IncarnationArgument, RunningShardsArgument, contact_of
from ..inputs import NodeInput
from ..types import Node


async def store_report(context: Context, report: NodeReport) -> NodeRecord:
    """registerNode's write: the node as stored (its answer is Node.of the record).

    One statement or one transaction (service/fleet/re_registration.py); the XIDs
    it carried are counted once it committed.
    """
    registration = await re_registration.register(context.engine, settled(report), context.actor)
    metrics.count_xids((x.gpu_class, x.xid) for x in registration.xids)
    # The row as the upsert returned it: one round trip fewer.
    return registration.node


def settled(report: NodeReport) -> NodeReport:
    """The report with its weights' observedAt times on the service's clock (observed_at.py)."""
    clock = observed_at.agent_clock(report.sent_at, report.received_at, report.clock_skew)
    return settle_observed_at(report, clock)


async def _read_back(conn: Connection, node_id: str) -> NodeRecord:
    record = await node_reads.get_node(conn, node_id)
    if record is None:
        raise NodeNotFound(node_id)
    return record


async def beat_answer(context: Context, beat: BeatRecord) -> Node:
    """A heartbeat's answer once the beat committed: the node as it is now.

    The beat returns the node's state only (node_reads.BeatRecord), so the
    rest of the node is read after it.
    """
    record: NodeRecord | None = await context.loaders.node.load(beat.id)
    if record is None:
        raise NodeNotFound(beat.id)
    return Node.of(record)


@strawberry.type
class NodeMutations:
    @strawberry.mutation(
        description="Agent: create or replace a node's report. An operator's cordon or drain survives it."
    )
    async def register_node(
        self,
        info: Info,
        input: NodeInput,
        incarnation: IncarnationArgument = None,
        running_shards: RunningShardsArgument = None,
    ) -> Node:
        context = info.context
        report = input.to_report(context.settings.clock_skew)
        contact = contact_of(incarnation, running_shards)
        if contact.says_anything:
            # Checks, report, reconciliation and answer in one transaction
            # (service/fleet/fencing.py).
            registration, answer = await fencing.contact_report(
                context.engine, settled(report), contact, context.actor
            )
            metrics.count_xids((x.gpu_class, x.xid) for x in registration.xids)
            metrics.count_registration(re_registration.TRANSACTION, "fencing")
            context.shards_to_stop[report.id] = answer.shards_to_stop
            return Node.of(registration.node)
        return Node.of(await store_report(context, report))

    @strawberry.mutation(
        description=(
            "Agent: I am alive. Brings an unreachable or lost node back to ready; errors for an "
            "unknown node (code NODE_NOT_FOUND) so the agent re-registers."
        )
    )
    async def heartbeat(
        self,
        info: Info,
        node_id: strawberry.ID,
        incarnation: IncarnationArgument = None,
        running_shards: RunningShardsArgument = None,
    ) -> Node:
        context = info.context
        contact = contact_of(incarnation, running_shards)
        if contact.says_anything:
            # Not batched: the checks, the beat, the reconciliation and the
            # answer are one transaction (service/fleet/fencing.py).
            beat, answer = await fencing.contact_heartbeat(context.engine, str(node_id), contact)
            context.shards_to_stop[beat.id] = answer.shards_to_stop
            return await beat_answer(context, beat)
        # Batched with this process's concurrent heartbeats: one transaction
        # for many (service/fleet/heartbeats.py); the reply waits for its commit.
        beat = await heartbeats.beat(context.engine, str(node_id))
        return await beat_answer(context, beat)

    @strawberry.mutation
    async def cordon_node(self, info: Info, id: strawberry.ID, reason: str) -> Node:
        async def work(conn: Connection) -> NodeRecord:
            await node_writes.cordon_node(conn, str(id), reason, info.context.actor)
            return await _read_back(conn, str(id))

        return Node.of(await info.context.write(work))

    @strawberry.mutation
    async def drain_node(self, info: Info, id: strawberry.ID, reason: str) -> Node:
        async def work(conn: Connection) -> NodeRecord:
            await node_writes.drain_node(conn, str(id), reason, info.context.actor)
            return await _read_back(conn, str(id))

        return Node.of(await info.context.write(work))

    @strawberry.mutation
    async def uncordon_node(self, info: Info, id: strawberry.ID) -> Node:
        async def work(conn: Connection) -> NodeRecord:
            await node_writes.uncordon_node(conn, str(id), info.context.actor)
            return await _read_back(conn, str(id))

        return Node.of(await info.context.write(work))

    @strawberry.mutation(description="Forget a node and its allocations.")
    async def remove_node(self, info: Info, id: strawberry.ID) -> bool:
        async def work(conn: Connection) -> bool:
            return await node_writes.remove_node(conn, str(id), info.context.actor)

        return await info.context.write(work)
