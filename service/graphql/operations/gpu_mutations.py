"""The operator's verbs on one GPU: cordon, uncordon, clear sticky health. One transaction each."""

from __future__ import annotations

import strawberry

from service.database.connections import Connection
from service.errors import NodeNotFound
from service.fleet import gpu_cordons, gpu_health
from service.fleet.node_details import GpuRecord, gpus_of

from ..context import Info
from ..types import Gpu


async def _read_back(conn: Connection, node_id: str, index: int) -> GpuRecord:
    for gpu in (await gpus_of(conn, [node_id])).get(node_id, []):
        if gpu.index == index:
            return gpu
    raise NodeNotFound(node_id)  # the verb checked both under the node's lock


@strawberry.type
class GpuMutations:
    @strawberry.mutation(
        graphql_type=Gpu,
        description=(
            "Take one GPU out of placement (a flaky GPU on an otherwise good node). "
            "What it runs keeps running."
        ),
    )
    async def cordon_gpu(
        self, info: Info, node_id: strawberry.ID, index: int, reason: str
    ) -> GpuRecord:
        async def work(conn: Connection) -> GpuRecord:
            await gpu_cordons.cordon_gpu(conn, str(node_id), index, reason, info.context.actor)
            return await _read_back(conn, str(node_id), index)

        return await info.context.write(work)

    @strawberry.mutation(graphql_type=Gpu)
    async def uncordon_gpu(self, info: Info, node_id: strawberry.ID, index: int) -> GpuRecord:
        async def work(conn: Connection) -> GpuRecord:
            await gpu_cordons.uncordon_gpu(conn, str(node_id), index, info.context.actor)
            return await _read_back(conn, str(node_id), index)

        return await info.context.write(work)

    @strawberry.mutation(
        graphql_type=Gpu,
        description=(
            "Clear sticky health reasons (xid_*, row_remap_*) after an operator reset the GPU "
            "by hand."
        ),
    )
    async def clear_gpu_health(self, info: Info, node_id: strawberry.ID, index: int) -> GpuRecord:
        async def work(conn: Connection) -> GpuRecord:
            await gpu_health.clear_gpu_health(conn, str(node_id), index, info.context.actor)
            return await _read_back(conn, str(node_id), index)

        return await info.context.write(work)
