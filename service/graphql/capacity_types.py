"""GraphQL types of the scheduler's capacity questions: freeGpus entries, fabrics, GPU classes."""

from __future__ import annotations

from typing import Any

import strawberry

from service import paging
from service.errors import NodeNotFound
from service.fleet import topology
from service.fleet.node_reads import NodeRecord
from service.scheduling.capacity import GpuClassSummary as GpuClassSummaryRecord

from .context import Info
from .loaders import ready
from .pages import answer, paged
from .types import Node


def _node_record(record: NodeRecord | None) -> NodeRecord | None:
    return record


async def load_node(info: Info, node_id: str) -> Node:
    record = await info.context.loaders.node.load(node_id)
    if record is None:
        # The node went away between the question and this field: say so
        # rather than return a half-answer.
        raise NodeNotFound(node_id)
    return Node.of(record)


@strawberry.type
class NodeFreeGpus:
    node_id: strawberry.Private[str]
    gpu_indices: list[int]

    @strawberry.field(graphql_type=Node)
    def node(self, info: Info) -> Any:
        # At once when the root field prefetched the page's nodes.
        record = ready(info.context.loaders.node, self.node_id, _node_record)
        if record is not None:
            return Node.of(record)
        return load_node(info, self.node_id)


@strawberry.type
class Fabric:
    name: str
    node_ids: strawberry.Private[tuple[str, ...]]

    @strawberry.field(
        description=paged(
            "Nodes attached to this fabric, sorted by id; a fabric spans the cluster, so the "
            "list is paged like `nodes`."
        )
    )
    async def nodes(
        self, info: Info, first: int | None = None, after: strawberry.ID | None = None
    ) -> list[Node]:
        request = info.context.page_request(first)
        ids = sorted(self.node_ids)
        if after is not None:
            ids = [i for i in ids if i > str(after)]
        page = paging.cut(ids[: request.limit], request, str)
        records = await info.context.loaders.node.load_many(page.entries)
        # A node removed since the fabric was read is left out.
        found = [r for r in records if r is not None]
        return answer(paging.Page(found, page.truncated), Node.of)


@strawberry.type(
    description=(
        "GPUs of one class across the cluster. total = free + allocated + unhealthy + "
        "unschedulable + tainted: an allocated GPU counts as allocated even when unhealthy or "
        "tainted, a healthy spare GPU on a node that is not READY counts as unschedulable (or "
        "tainted, when a NO_SCHEDULE or NO_EXECUTE taint withholds it). unhealthy also counts "
        "cordoned GPUs (cordonGpu): neither may be placed on. free is what a request without "
        "tolerations is offered."
    )
)
class GpuClassSummary:
    gpu_class: str
    total: int
    free: int
    allocated: int
    unhealthy: int
    unschedulable: int
    tainted: int = strawberry.field(
        default=0,
        description=(
            "Usable, unheld GPUs a NO_SCHEDULE or NO_EXECUTE taint withholds (not counted in free)."
        ),
    )
    reserved: int = strawberry.field(
        default=0,
        description=(
            "Usable, unheld GPUs set aside for a reservation (not counted in free; "
            "docs/scheduler/reservations.md)."
        ),
    )

    @strawberry.field(
        description=(
            "Fragmentation: free GPUs of this class in NVLink groups with fewer than shardSize "
            "free, which a tensor-parallel shard of that width cannot use. Nodes whose topology "
            "is unknown are not counted."
        )
    )
    async def nvlink_fragmented_free(self, info: Info, shard_size: int = 8) -> int:
        return await info.context.read(
            lambda conn: topology.fragmented_free(conn, self.gpu_class, shard_size)
        )

    @classmethod
    def of(cls, s: GpuClassSummaryRecord) -> GpuClassSummary:
        return cls(
            gpu_class=s.gpu_class,
            total=s.total,
            free=s.free,
            allocated=s.allocated,
            unhealthy=s.unhealthy,
            tainted=s.tainted,
            unschedulable=s.unschedulable,
            reserved=s.reserved,
        )
