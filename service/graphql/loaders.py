"""Per-request DataLoaders: a page of N nodes costs one statement per kind of detail.

Created anew for each request, so no request sees another's cache, and each
batch opens its own connection: resolvers run concurrently and an asyncpg
connection serves one statement at a time.

A root field that returns a page of nodes also prefetches the details its
query selects (prefetch_nodes), so every Node field can answer from the cache
synchronously (`ready`). That matters more than the statements: an awaited
field on each of a thousand nodes makes graphql-core schedule a task per node
and gather them, which cost more than building the answer itself.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine
from strawberry.dataloader import DataLoader
from strawberry.types.nodes import FragmentSpread, InlineFragment, SelectedField, Selection

from service.database import read_routing
from service.database.connections import Connection
from service.fleet import node_details, node_reads
from service.fleet.health import drift, remediations, taints, validations
from service.scheduling import allocations

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")

Fetch = Callable[[Connection, Sequence[Any]], Awaitable[Mapping[Any, Any]]]


def _loader(engine: AsyncEngine, fetch: Fetch, missing: Callable[[], Any]) -> DataLoader[Any, Any]:
    async def load(keys: list[Any]) -> list[Any]:
        # Where the request's reads go: a replica when it tolerates staleness.
        found = await read_routing.read(engine, lambda conn: fetch(conn, keys))
        return [found[k] if k in found else missing() for k in keys]

    return DataLoader(load_fn=load)


def selected(selections: Iterable[Selection]) -> dict[str, list[Selection]]:
    """Field name -> the sub-selections asked of it, fragments flattened."""
    out: dict[str, list[Selection]] = {}
    for s in selections:
        if isinstance(s, SelectedField):
            out.setdefault(s.name, []).extend(s.selections)
        elif isinstance(s, (InlineFragment, FragmentSpread)):
            for name, subs in selected(s.selections).items():
                out.setdefault(name, []).extend(subs)
    return out


# Node fields -> the detail loader they read.
_NODE_DETAILS = {
    "gpus": "gpus",
    "freeGpus": "gpus",
    "fabrics": "fabrics",
    "hcasFor": "fabrics",
    "storage": "filesystems",
    "weights": "weights",
    "hasWeights": "weights",
    "allocations": "shards_on_node",
    "taints": "taints",
    "drift": "drift",
    "remediations": "open_remediations",
}


def _none() -> None:
    return None


class Loaders:
    """Each loader is made on first use: a heartbeat needs none of them, and making
    all seven for every request was a sixth of a small mutation's CPU."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._sources: dict[int, tuple[Fetch, Callable[[], Any]]] = {}

    @functools.cached_property
    def node(self) -> DataLoader[Any, Any]:
        return self._make(node_reads.get_nodes, _none)

    @functools.cached_property
    def gpus(self) -> DataLoader[Any, Any]:
        return self._make(node_details.gpus_of, list)

    @functools.cached_property
    def fabrics(self) -> DataLoader[Any, Any]:
        return self._make(node_details.fabrics_of, list)

    @functools.cached_property
    def filesystems(self) -> DataLoader[Any, Any]:
        return self._make(node_details.filesystems_of, list)

    @functools.cached_property
    def weights(self) -> DataLoader[Any, Any]:
        return self._make(node_details.weights_of, list)

    @functools.cached_property
    def shards_on_node(self) -> DataLoader[Any, Any]:
        return self._make(allocations.shards_on_nodes, list)

    @functools.cached_property
    def taints(self) -> DataLoader[Any, Any]:
        """A node's taints and its GPUs' (fleet/health/taints.py), for Node.taints and Gpu.taints."""
        return self._make(taints.taints_of, list)

    @functools.cached_property
    def validations(self) -> DataLoader[Any, Any]:
        """The tests each node should run now (fleet/health/validations.py), for Node.validationsToRun."""
        return self._make(validations.to_run, list)

    @functools.cached_property
    def drift(self) -> DataLoader[Any, Any]:
        """Each node's drift findings (fleet/health/drift.py), for Node.drift."""
        return self._make(drift.drift_of, list)

    @functools.cached_property
    def open_remediations(self) -> DataLoader[Any, Any]:
        """Each node's open remediations (fleet/health/remediations.py), for Node.remediations."""
        return self._make(remediations.open_of, list)

    @functools.cached_property
    def shard(self) -> DataLoader[Any, Any]:
        return self._make(allocations.shards_by_id, _none)

    def _make(self, fetch: Fetch, missing: Callable[[], Any]) -> DataLoader[Any, Any]:
        loader = _loader(self._engine, fetch, missing)
        self._sources[id(loader)] = (fetch, missing)
        return loader

    async def prefetch(
        self, conn: Connection, loader: DataLoader[Any, Any], keys: Iterable[Any]
    ) -> None:
        """Load keys not yet cached in one statement on `conn` and prime the loader with them.

        Straight to the batch function: load_many would make a future per key.
        """
        wanted = [k for k in dict.fromkeys(keys) if loader.cache_map.get(k) is None]
        if not wanted:
            return
        fetch, missing = self._sources[id(loader)]
        found = await fetch(conn, wanted)
        loader.prime_many({k: found[k] if k in found else missing() for k in wanted})

    async def prefetch_nodes(
        self, conn: Connection, node_ids: Sequence[str], selections: list[Selection]
    ) -> None:
        """The details a query selects of these nodes, before graphql-core resolves them.

        One after another on the caller's connection: each checkout of another
        pooled connection costs its own round trips (ping, BEGIN, ROLLBACK), and
        on two cores that CPU is worth more than the overlap.
        """
        fields = selected(selections)
        for name in dict.fromkeys(_NODE_DETAILS[f] for f in fields if f in _NODE_DETAILS):
            await self.prefetch(conn, getattr(self, name), node_ids)


def ready(loader: DataLoader[K, V], key: K, convert: Callable[[V], R]) -> R | None:
    """convert(the cached value) if the loader already holds it, else None."""
    future = loader.cache_map.get(key)
    if future is None or not future.done() or future.cancelled() or future.exception():
        return None
    return convert(future.result())


def now_or_later(
    loader: DataLoader[K, V], key: K, convert: Callable[[V], R]
) -> R | Coroutine[Any, Any, R]:
    """The converted value at once when cached (no task for graphql-core to schedule), else an awaitable."""
    future = loader.cache_map.get(key)
    if future is not None and future.done() and not future.cancelled() and not future.exception():
        return convert(future.result())

    async def later() -> R:
        return convert(await loader.load(key))

    return later()
