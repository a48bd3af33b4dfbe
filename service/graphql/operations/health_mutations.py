"""The operator's taints on GPUs and nodes, remediations' steps, validations. One transaction each."""

from __future__ import annotations

import strawberry

from service.database.connections import Connection
from service.errors import NodeNotFound
from service.fleet import node_reads
from service.fleet.health import drift, remediations, taints, validations
from service.fleet.node_details import GpuRecord, gpus_of
from service.fleet.node_reads import NodeRecord

from ..context import Info
from ..health_types import Remediation, TaintInput, ValidationInput, remediation_id
from ..profile_types import HardwareProfile, HardwareProfileInput
from ..types import Gpu, Node


async def _gpus(conn: Connection, node_id: str, indices: list[int]) -> list[GpuRecord]:
    wanted = set(indices)
    return [g for g in (await gpus_of(conn, [node_id])).get(node_id, []) if g.index in wanted]


async def _node(conn: Connection, node_id: str) -> NodeRecord:
    record = await node_reads.get_node(conn, node_id)
    if record is None:
        raise NodeNotFound(node_id)  # the verb checked it under the node's lock
    return record


@strawberry.type
class HealthMutations:
    @strawberry.mutation(
        graphql_type=list[Gpu],
        description=(
            "Put a taint on GPUs of a node (a taint of the same key there is replaced). "
            "NO_SCHEDULE and NO_EXECUTE keep new work off them unless tolerated; what runs there "
            "keeps running (NO_EXECUTE: it is told to stop once its toleration runs out). "
            "Survives re-registration."
        ),
    )
    async def taint_gpus(
        self, info: Info, node_id: strawberry.ID, indices: list[int], taint: TaintInput
    ) -> list[GpuRecord]:
        async def work(conn: Connection) -> list[GpuRecord]:
            chosen = await taints.taint_gpus(
                conn, str(node_id), indices, taint.to_request(), info.context.actor
            )
            return await _gpus(conn, str(node_id), chosen)

        return await info.context.write(work)

    @strawberry.mutation(
        graphql_type=list[Gpu],
        description="Lift the taint with this key from GPUs of a node (a cordon: uncordonGpu).",
    )
    async def untaint_gpus(
        self, info: Info, node_id: strawberry.ID, indices: list[int], key: str
    ) -> list[GpuRecord]:
        async def work(conn: Connection) -> list[GpuRecord]:
            chosen = await taints.untaint_gpus(conn, str(node_id), indices, key, info.context.actor)
            return await _gpus(conn, str(node_id), chosen)

        return await info.context.write(work)

    @strawberry.mutation(
        description="Put a taint on a node: on every GPU it has and will have, until lifted."
    )
    async def taint_node(self, info: Info, node_id: strawberry.ID, taint: TaintInput) -> Node:
        async def work(conn: Connection) -> NodeRecord:
            await taints.taint_node(conn, str(node_id), taint.to_request(), info.context.actor)
            return await _node(conn, str(node_id))

        return Node.of(await info.context.write(work))

    @strawberry.mutation(description="Lift a node's taint with this key (a cordon: uncordonNode).")
    async def untaint_node(self, info: Info, node_id: strawberry.ID, key: str) -> Node:
        async def work(conn: Connection) -> NodeRecord:
            await taints.untaint_node(conn, str(node_id), key, info.context.actor)
            return await _node(conn, str(node_id))

        return Node.of(await info.context.write(work))

    @strawberry.mutation(
        description=(
            "The operator's automation takes a PENDING remediation: IN_PROGRESS. Any other state "
            "(a second start included) is CONFLICT, nothing changed."
        )
    )
    async def start_remediation(self, info: Info, id: strawberry.ID) -> Remediation:
        number = remediation_id(id)

        async def work(conn: Connection) -> remediations.Remediation:
            return await remediations.start(conn, number, info.context.actor)

        return Remediation.of(await info.context.write(work))

    @strawberry.mutation(
        description=(
            "The action of an IN_PROGRESS remediation was carried out: AWAITING_VALIDATION (DONE "
            "when the policy requires no test), or ESCALATED when it did not succeed. Any other "
            "state is CONFLICT (a PENDING one must be started first)."
        )
    )
    async def finish_remediation(
        self, info: Info, id: strawberry.ID, succeeded: bool, note: str | None = None
    ) -> Remediation:
        number = remediation_id(id)

        async def work(conn: Connection) -> remediations.Remediation:
            return await remediations.finish(conn, number, succeeded, note, info.context.actor)

        return Remediation.of(await info.context.write(work))

    @strawberry.mutation(
        description=(
            "Agent (or an operator's tool): a validation ran on GPUs of a node. The remediation "
            "awaiting it is answered as it now stands (DONE once every required test passed, "
            "ESCALATED after the allowed failures); null when none awaits one there (a failure "
            "then taints the GPUs validation-<test>, a later pass lifts it)."
        )
    )
    async def record_validation(self, info: Info, input: ValidationInput) -> Remediation | None:
        result = input.to_result()

        async def work(conn: Connection) -> remediations.Remediation | None:
            return await validations.record(conn, result, info.context.actor)

        found = await info.context.write(work)
        return None if found is None else Remediation.of(found)

    @strawberry.mutation(
        description=(
            "Create or replace a hardware profile: what the nodes with its selector's label should "
            "have. Those nodes (and the ones its old selector picked) are compared again at once: "
            "Node.drift, the drift_found and drift_cleared events, the policy's DRIFT taints."
        )
    )
    async def set_hardware_profile(
        self, info: Info, input: HardwareProfileInput
    ) -> HardwareProfile:
        profile = input.to_profile()

        async def work(conn: Connection) -> None:
            await drift.set_profile(conn, profile, info.context.actor)

        await info.context.write(work)
        return HardwareProfile.of(profile)

    @strawberry.mutation(
        description=(
            "Remove a hardware profile (false: there was none); its nodes' drift clears, or "
            "follows another profile that selects them."
        )
    )
    async def remove_hardware_profile(self, info: Info, name: str) -> bool:
        async def work(conn: Connection) -> bool:
            return await drift.remove_profile(conn, name, info.context.actor)

        return await info.context.write(work)
