"""Read-only root fields. Each opens its own connection: resolvers run concurrently."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import strawberry

from service import paging
from service.database import connections
from service.database.connections import Connection
from service.fleet import node_details, node_reads
from service.scheduling import allocations, capacity

from ..capacity_types import Fabric, GpuClassSummary, NodeFreeGpus
from ..context import Info
from ..health_types import TOLERATIONS, TolerationInput, tolerations_of
from ..inputs import NodeFilter
from ..loaders import selected
from ..pages import answer, paged
from ..reservation_types import AT
from ..types import Allocation, Node, Weights

# freeGpus without minFree (or with null): nodes with at least one.
MIN_FREE = 1


@dataclass(frozen=True, slots=True)
class FreeGpusArguments:
    gpu_class: str | None
    fabric: str | None
    min_free: int
    after: str | None


def free_gpus_arguments(
    gpu_class: str | None, fabric: str | None, min_free: int | None, after: str | None
) -> FreeGpusArguments:
    """freeGpus' arguments as capacity.free_gpus takes them.

    The one mapping, for the resolver and anyone who answers the same field
    its own way: a default stated twice drifts.
    """
    return FreeGpusArguments(
        gpu_class,
        fabric,
        MIN_FREE if min_free is None else min_free,
        str(after) if after is not None else None,
    )


@dataclass(frozen=True, slots=True)
class NodesArguments:
    node_filter: node_reads.NodeFilter
    after: str | None


def nodes_arguments(filter_: NodeFilter | None, after: str | None) -> NodesArguments:
    """nodes' arguments as node_reads.list_nodes takes them (the one mapping, as above)."""
    return NodesArguments(
        filter_.to_record() if filter_ is not None else node_reads.NodeFilter(),
        str(after) if after is not None else None,
    )


MAX_AGE = (
    "Seconds: only nodes whose GPU facts (Node.gpusObservedAt) are at most this old. "
    "Negative: BAD_INPUT."
)


@strawberry.type
class NodeQueries:
    @strawberry.field
    async def node(self, info: Info, id: strawberry.ID) -> Node | None:
        record = await info.context.loaders.node.load(str(id))
        return None if record is None else Node.of(record)

    @strawberry.field(description=paged("Nodes matching the filter, sorted by id."))
    async def nodes(
        self,
        info: Info,
        filter_: Annotated[NodeFilter | None, strawberry.argument(name="filter")] = None,
        first: int | None = None,
        after: strawberry.ID | None = None,
        max_age: Annotated[int | None, strawberry.argument(description=MAX_AGE)] = None,
    ) -> list[Node]:
        request = info.context.page_request(first)
        given = nodes_arguments(filter_, after)
        if max_age is not None:
            given = dataclasses.replace(
                given, node_filter=dataclasses.replace(given.node_filter, max_age=max_age)
            )
        loaders = info.context.loaders

        async def read(conn: Connection) -> paging.Page[node_reads.NodeRecord]:
            found = await node_reads.list_nodes(conn, given.node_filter, request.limit, given.after)
            page = paging.cut(found, request, lambda record: record.id)
            loaders.node.prime_many({record.id: record for record in page.entries})
            # The details this query selects, for the whole page at once: its
            # Node fields then answer without a task per node (see loaders.py).
            await loaders.prefetch_nodes(
                conn, [r.id for r in page.entries], info.selected_fields[0].selections
            )
            return page

        return answer(await info.context.read(read, max_age=max_age), Node.of)

    @strawberry.field(
        description=paged(
            "Free, healthy GPUs on schedulable nodes, one entry per node that has at least "
            "minFree of them, sorted by node id.",
            cursor="node id",
        )
    )
    async def free_gpus(
        self,
        info: Info,
        gpu_class: str | None = None,
        fabric: str | None = None,
        min_free: int | None = MIN_FREE,
        first: int | None = None,
        after: strawberry.ID | None = None,
        max_age: Annotated[int | None, strawberry.argument(description=MAX_AGE)] = None,
        tolerations: Annotated[
            list[TolerationInput] | None, strawberry.argument(description=TOLERATIONS)
        ] = None,
        at: Annotated[
            datetime | None,
            strawberry.argument(
                description=AT + " Without `at`, GPUs set aside for a reservation are not listed."
            ),
        ] = None,
    ) -> list[NodeFreeGpus]:
        request = info.context.page_request(first)
        given = free_gpus_arguments(gpu_class, fabric, min_free, after)
        node = selected(info.selected_fields[0].selections).get("node")
        loaders = info.context.loaders

        async def read(conn: Connection) -> paging.Page[capacity.NodeFreeGpus]:
            found = await capacity.free_gpus(
                conn,
                gpu_class=given.gpu_class,
                fabric=given.fabric,
                min_free=given.min_free,
                first=request.limit,
                after=given.after,
                max_age=max_age,
                tolerations=tolerations_of(tolerations),
                at=at,
            )
            page = paging.cut(found, request, lambda entry: entry.node_id)
            if node is not None:
                # The page's nodes and their selected details, on this connection.
                ids = [f.node_id for f in page.entries]
                await loaders.prefetch(conn, loaders.node, ids)
                await loaders.prefetch_nodes(conn, ids, node)
            return page

        page = await info.context.read(read, max_age=max_age)
        return answer(
            page, lambda f: NodeFreeGpus(node_id=f.node_id, gpu_indices=list(f.gpu_indices))
        )

    @strawberry.field
    async def fabrics(self, info: Info) -> list[Fabric]:
        found = await info.context.read(capacity.fabrics)
        return [Fabric(name=f.name, node_ids=f.node_ids) for f in found]

    @strawberry.field(
        graphql_type=list[Weights],
        description=(
            "For an eviction tool: the node's weights that no replica pins, sorted by path "
            "(empty for an unknown node). Pinned weights (Node.weights.pinnedBy) must stay."
        ),
    )
    async def weights_evictable(self, info: Info, node_id: strawberry.ID) -> Any:
        async with connections.autocommit(info.context.engine) as conn:
            # The records themselves: Weights is served by them (SERVED_BY_RECORDS).
            return await node_details.weights_evictable(conn, str(node_id))

    @strawberry.field
    async def gpu_classes(self, info: Info) -> list[GpuClassSummary]:
        found = await info.context.read(capacity.gpu_classes)
        return [GpuClassSummary.of(s) for s in found]

    @strawberry.field(description=paged("Allocations sorted by shard id.", cursor="shard id"))
    async def allocations(
        self,
        info: Info,
        node_id: strawberry.ID | None = None,
        replica_id: strawberry.ID | None = None,
        first: int | None = None,
        after: strawberry.ID | None = None,
        held: Annotated[
            bool,
            strawberry.argument(
                description=(
                    "Only shards held for a LOST node (INVENTORY_LOST_POLICY=hold): stale until "
                    "the node confirms them or an operator frees them."
                )
            ),
        ] = False,
    ) -> list[Allocation]:
        request = info.context.page_request(first)
        async with connections.autocommit(info.context.engine) as conn:
            shards = await allocations.list_allocations(
                conn,
                node_id=str(node_id) if node_id is not None else None,
                replica_id=str(replica_id) if replica_id is not None else None,
                first=request.limit,
                after=str(after) if after is not None else None,
                held=held,
            )
        return answer(paging.cut(shards, request, lambda s: s.shard_id), Allocation.of)
