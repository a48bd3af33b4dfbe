"""Which fabric a multi-node replica runs on, and the adapters each of its shards is handed there.

allocate()'s choice (allocations/allocating.py): a replica's nodes, the ones
asked for and the ones its earlier shards are on, must share a fabric; the
one named (place() passes the fabric it planned on), else the one its earlier
shards recorded, else service/scheduling/fabric_choice.py's rule over the
fabrics they share. A replica on one node talks to no peer: no fabric, no
adapters.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text

from service.database.connections import Connection
from service.scheduling.allocations.records import ShardRecord
from service.scheduling.allocations.requests import AllocationRequest
from service.scheduling.fabric_choice import choose_fabric
from service.scheduling.rejections import Rejection, RejectionCode, shown

_FABRICS = text(
    """
    SELECT node_id, fabric, hcas, rate_gbps FROM fabric_attachments
    WHERE node_id = ANY(CAST(:ids AS text[]))
    ORDER BY node_id, fabric
    """
)


@dataclass(frozen=True)
class Attachment:
    hcas: tuple[str, ...]
    rate_gbps: int


@dataclass(frozen=True)
class FabricChoice:
    fabric: str | None
    hcas: dict[str, tuple[str, ...]]


def _fabric_rule(
    attachments: dict[str, dict[str, Attachment]], node_ids: Sequence[str]
) -> str | None:
    """The fabric a multi-node replica runs on: fabric_choice's rule over the fabrics its nodes share."""
    common = set.intersection(*(set(attachments.get(n, {})) for n in node_ids))
    return choose_fabric(common, lambda f: (attachments[n][f].rate_gbps for n in node_ids))


async def fabric_for(
    conn: Connection,
    request: AllocationRequest,
    earlier: Sequence[ShardRecord],
    wanted: str | None,
) -> Rejection | FabricChoice:
    """The fabric and adapters of the request's shards (`wanted`: the fabric named), or FABRIC_MISMATCH."""
    node_ids = sorted({s.node_id for s in request.shards} | {s.node_id for s in earlier})
    if len(node_ids) == 1:
        # One node talks to no peer: no fabric to agree on, no adapters to hand out.
        return FabricChoice(None, {})
    rows = await conn.execute(_FABRICS, {"ids": node_ids})
    attachments: dict[str, dict[str, Attachment]] = defaultdict(dict)
    for r in rows:
        attachments[r.node_id][r.fabric] = Attachment(tuple(r.hcas), r.rate_gbps)
    recorded = {s.fabric for s in earlier if s.fabric is not None}
    wanted = wanted or (min(recorded) if recorded else None)
    if wanted is not None:
        for node_id in node_ids:
            if wanted not in attachments.get(node_id, {}):
                return Rejection(
                    RejectionCode.FABRIC_MISMATCH,
                    f"node {shown(node_id)} is not on fabric {shown(wanted)}, which replica "
                    f"{shown(request.replica_id)} needs",
                    node_id=node_id,
                )
        fabric: str | None = wanted
    else:
        fabric = _fabric_rule(attachments, node_ids)
    if fabric is None:
        on = "; ".join(
            f"{shown(n)}: {', '.join(sorted(attachments.get(n, {}))) or 'none'}"
            for n in node_ids[:8]
        )
        more = f" and {len(node_ids) - 8} more" if len(node_ids) > 8 else ""
        return Rejection(
            RejectionCode.FABRIC_MISMATCH,
            f"the nodes of replica {shown(request.replica_id)} share no fabric ({on}{more}); "
            "a multi-node replica must sit on one fabric",
            node_id=node_ids[0],
        )
    return FabricChoice(fabric, {n: attachments[n][fabric].hcas for n in node_ids})
