"""register, hold and place through the API, as agents and schedulers do."""

from __future__ import annotations

from typing import Any

from tests.support.api import Api
from tests.support.reports import (
    ALLOCATE,
    PLACE,
    REGISTER,
    allocation,
    node_input,
    placement,
    shard,
)
from tests.support.statements import StatementCounter


async def register(api: Api, node_id: str, **fields: Any) -> None:
    await api(REGISTER, {"input": node_input(node_id, **fields)})


async def hold(api: Api, node_id: str, count: int) -> None:
    """Something else already runs on the node's first `count` GPUs."""
    await hold_gpus(api, node_id, *range(count))


async def hold_gpus(api: Api, node_id: str, *indices: int) -> None:
    """Something else already runs on these GPUs of the node."""
    request = allocation(f"busy-{node_id}", shard(f"busy-{node_id}-s0", node_id, *indices))
    assert (await api(ALLOCATE, request))["allocate"]["__typename"] == "Allocated"


async def place(api: Api, replica_id: str, **fields: Any) -> dict[str, Any]:
    result: dict[str, Any] = (await api(PLACE, placement(replica_id, **fields)))["place"]
    return result


def statements_sent(count_statements: StatementCounter) -> list[str]:
    # Left out: the token check, which runs at most once a second, and
    # event announcements, sent after commit whenever their flush runs.
    return [
        s for s in count_statements.statements if "api_tokens" not in s and "pg_notify" not in s
    ]
