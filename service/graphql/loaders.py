"""Per-request DataLoaders: a page of N nodes costs one statement per kind of detail.

Created anew for each request, so no request sees another's cache, and each
batch opens its own connection: resolvers run concurrently and an asyncpg
connection serves one statement at a time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from strawberry.dataloader import DataLoader

from service import allocations, hardware, node_views

K = TypeVar("K")
V = TypeVar("V")


def _loader(
    engine: AsyncEngine,
    fetch: Callable[[AsyncConnection, Sequence[Any]], Awaitable[Mapping[Any, Any]]],
    missing: Callable[[], Any],
) -> DataLoader[Any, Any]:
    async def load(keys: list[Any]) -> list[Any]:
        async with engine.connect() as conn:
            found = await fetch(conn, keys)
        return [found[k] if k in found else missing() for k in keys]

    return DataLoader(load_fn=load)


class Loaders:
    def __init__(self, engine: AsyncEngine) -> None:
        self.node = _loader(engine, node_views.get_nodes, lambda: None)
        self.gpus = _loader(engine, hardware.gpus_of, list)
        self.fabrics = _loader(engine, hardware.fabrics_of, list)
        self.filesystems = _loader(engine, hardware.filesystems_of, list)
        self.weights = _loader(engine, hardware.weights_of, list)
        self.shards_on_node = _loader(engine, allocations.shards_on_nodes, list)
        self.shard = _loader(engine, allocations.shards_by_id, lambda: None)
