"""Reservations as a scheduler uses them over GraphQL: the documents and small helpers tests share."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.scheduling.reservations import TRANSITIONS
from service.scheduling.timeline import run_due
from tests.support.api import Api

RESERVATION_FIELDS = """
id tenant count start end state gpus { nodeId gpuIndices } used missingGpus
releaseIfUnusedAfter reason
"""
RESERVE = f"""
mutation R($input: ReservationInput!) {{
  reserve(input: $input) {{
    __typename
    ... on Reservation {{ {RESERVATION_FIELDS} }}
    ... on Unplaceable {{ message verdicts {{ nodeId code detail }} quota {{ used limit asked }} }}
    ... on AllocationRejected {{ code message }}
  }}
}}
"""
RELEASE_RESERVATION = (
    f"mutation R($id: ID!) {{ releaseReservation(id: $id) {{ {RESERVATION_FIELDS} }} }}"
)
RESERVATION = f"query R($id: ID!) {{ reservation(id: $id) {{ {RESERVATION_FIELDS} }} }}"
RESERVATIONS = f"""
query L($tenant: ID, $state: ReservationState) {{
  reservations(tenant: $tenant, state: $state) {{ {RESERVATION_FIELDS} }}
}}
"""
FREE = 'query F { freeGpus(gpuClass: "H100-80GB") { node { id } gpuIndices } }'


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def soon(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def shape(per: int = 8, **fields: Any) -> dict[str, Any]:
    return {"replicaId": "shape", "gpuClass": "H100-80GB", "gpusPerShard": per, **fields}


async def reserve(api: Api, reservation_id: str, **fields: Any) -> Any:
    spec: dict[str, Any] = {"id": reservation_id, "shape": shape(), "count": 1, **fields}
    for key in ("start", "end"):
        if isinstance(spec.get(key), datetime):
            spec[key] = iso(spec[key])
    return (await api(RESERVE, {"input": spec}))["reserve"]


async def free_by_node(api: Api) -> dict[str, list[int]]:
    return {e["node"]["id"]: e["gpuIndices"] for e in (await api(FREE))["freeGpus"]}


async def until_past(moment: datetime) -> None:
    """Sleep until `moment` has passed (plus a little, for the database's clock)."""
    delay = (moment - datetime.now(UTC)).total_seconds() + 0.05
    if delay > 0:
        await asyncio.sleep(delay)


async def tick(engine: AsyncEngine) -> int:
    """One round of the timeline, as every service process runs it."""
    return await run_due(engine, TRANSITIONS)
