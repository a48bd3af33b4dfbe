"""Plain fields are completed by the service's execution context, and the answer is graphql-core's to the byte.

Every question is asked twice, once through Strawberry's stock execution
context and once through the service's (service/graphql/fast/execution.py), with a
context made the same way, and the two answers must be identical: the same
data in the same order, the same errors with the same messages, locations and
paths.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum
from inspect import isawaitable
from typing import Any

import pytest
import strawberry
from graphql import ExecutionResult, GraphQLSchema, Undefined, execute, parse
from sqlalchemy.ext.asyncio import AsyncEngine
from strawberry.execution.is_awaitable import optimized_is_awaitable
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

from service.access_control.auth import OPEN_ACCESS
from service.config import Settings
from service.graphql.context import new_context
from service.graphql.fast import execution
from service.graphql.fast.execution import NOT_READY, PlainFieldExecutionContext
from service.graphql.schema import schema as service_schema
from tests.support.api import Api
from tests.support.reports import (
    ALLOCATE,
    GB,
    H100,
    L40S,
    REGISTER,
    TB,
    allocation,
    gpus,
    node_input,
    shard,
)


class CountingStock(StrawberryGraphQLCoreExecutionContext):
    """The stock context, counting the fields graphql-core executes one by one."""

    calls = 0

    def execute_field(self, *args: Any, **kwargs: Any) -> Any:
        type(self).calls += 1
        return super().execute_field(*args, **kwargs)


class CountingPlain(PlainFieldExecutionContext):
    calls = 0

    def execute_field(self, *args: Any, **kwargs: Any) -> Any:
        type(self).calls += 1
        return super().execute_field(*args, **kwargs)


async def run(
    schema: GraphQLSchema,
    query: str,
    executor_class: type[StrawberryGraphQLCoreExecutionContext],
    variables: dict[str, Any] | None = None,
    context: Any = None,
) -> ExecutionResult:
    """What Strawberry's schema.execute does, with the execution context chosen by the test."""
    result = execute(
        schema,
        parse(query),
        context_value=context,
        variable_values=variables,
        executor_class=executor_class,
        is_awaitable=optimized_is_awaitable,
    )
    if isawaitable(result):
        awaited: ExecutionResult = await result
        return awaited
    assert isinstance(result, ExecutionResult)
    return result


def answer(result: ExecutionResult) -> tuple[str, list[dict[str, Any]]]:
    """The response as a client reads it: the data in its order, the errors as sent."""
    return json.dumps(result.data), [e.formatted for e in result.errors or ()]


# A cluster with something of everything a Node can say.

IB_A = {"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}
IB_B = {"fabric": "ib-b", "hcas": ["mlx5_2"], "rateGbps": 200}
LOCAL = {
    "id": "dev-2049",
    "mountPoint": "/data",
    "fsType": "xfs",
    "shared": False,
    "freeBytes": 3 * TB,
    "totalBytes": 7 * TB,
    "directories": ["/data/models", "/data/cache"],
}
SHARED = {
    "id": "filer-1",
    "mountPoint": "/mnt/filer",
    "fsType": "nfs",
    "shared": True,
    "freeBytes": 90 * TB,
    "totalBytes": 200 * TB,
    "directories": ["/mnt/filer/models"],
}


async def build_cluster(api: Api) -> None:
    sick = gpus(H100, 8)
    sick[3] = {**sick[3], "healthy": False, "healthReasons": ["ecc_uncorrected", "xid_79"]}
    sick[5] = {**sick[5], "pciBusId": "00000000:18:00.0"}
    await api(
        REGISTER,
        {
            "input": node_input(
                "gpu-01",
                gpus=sick,
                labels=[{"key": "rack", "value": "r7"}, {"key": "zone", "value": "a"}],
                memoryTotalMb=2_000_000,
                fabrics=[IB_A, IB_B],
                storage=[LOCAL, SHARED],
                weights=[
                    {"path": "/models/llama-70b", "sizeBytes": 140 * GB},
                    {"path": "/models/unsized"},
                ],
                agentVersion="1.4.2",
                engineVersions=[
                    {"key": "vllm", "value": "0.6.3"},
                    {"key": "sglang", "value": "0.3"},
                ],
            )
        },
    )
    await api(
        REGISTER,
        {"input": node_input("gpu-02", gpus=gpus(L40S, 4), fabrics=[IB_A], storage=[SHARED])},
    )
    await api(REGISTER, {"input": node_input("gpu-03", gpus=gpus(H100, 2))})
    await api(ALLOCATE, allocation("llama-r1", shard("llama-r1-s0", "gpu-01", 0, 1, 2)))
    await api(
        ALLOCATE,
        allocation("big-r1", shard("big-r1-s0", "gpu-01", 6), shard("big-r1-s1", "gpu-02", 0, 1)),
    )
    await api('mutation { cordonNode(id: "gpu-03", reason: "bad fan") { id } }')


EVERYTHING = """
query Everything($withGpus: Boolean!, $skipStorage: Boolean!, $cls: String) {
  __typename
  nodes(first: 10) {
    __typename
    ...Identity
    nodeId: id
    labels { __typename key value }
    labels { key }
    memoryTotalMb state stateReason schedulable lastSeen agentVersion
    engineVersions { key value }
    localDisk { freeBytes totalBytes }
    sharedDisk { __typename freeBytes totalBytes }
    knowsItsWeights stateChangedBy registeredAt
    gpus @include(if: $withGpus) { ...GpuFields allocation { __typename shardId replicaId } }
    gpus { index allocation { nodeId gpuIndices createdAt fabric hcas } }
    cards: gpus { uuid healthy }
    freeGpus(gpuClass: $cls) { index gpuClass }
    fabrics { fabric hcas rateGbps }
    hcasFor(fabric: "ib-a")
    storage @skip(if: $skipStorage) {
      id mountPoint fsType shared freeBytes totalBytes directories
    }
    ... on Node { weights { path sizeBytes } hasWeights(source: "/models/llama-70b") }
    allocations { __typename shardId replicaId nodeId gpuIndices createdAt fabric hcas }
  }
  node(id: "gpu-01") { ...Identity gpus { healthReasons } localDisk { ... on Disk { freeBytes } } }
  missing: node(id: "gpu-99") { id }
  freeGpus(first: 10) { gpuIndices node { id hostname state gpus { index } } }
  gpuClasses { __typename gpuClass total free allocated unhealthy unschedulable }
  fabrics { name nodes { id hostname } }
  allocations { shardId replicaId gpuIndices fabric hcas createdAt }
}

fragment Identity on Node { id hostname mgmtAddr }

fragment GpuFields on Gpu {
  __typename index uuid pciBusId name gpuClass memoryMb healthy healthReasons
}
"""


async def test_a_page_of_every_node_field_reads_the_same_through_both_execution_contexts(
    api: Api, engine: AsyncEngine, settings: Settings
) -> None:
    await build_cluster(api)

    for variables in (
        {"withGpus": True, "skipStorage": False, "cls": "H100-80GB"},
        {"withGpus": False, "skipStorage": True, "cls": None},
    ):
        CountingStock.calls = CountingPlain.calls = 0
        stock = await run(
            service_schema._schema,
            EVERYTHING,
            CountingStock,
            variables,
            new_context(engine, settings, principal=OPEN_ACCESS),
        )
        plain = await run(
            service_schema._schema,
            EVERYTHING,
            CountingPlain,
            variables,
            new_context(engine, settings, principal=OPEN_ACCESS),
        )

        assert stock.errors is None
        assert stock.data is not None and len(stock.data["allocations"]) == 3
        assert answer(plain) == answer(stock)
        cordoned = stock.data["nodes"][2]
        assert (cordoned["state"], cordoned["stateReason"]) == ("CORDONED", "bad fan")
        # And the new context did answer the plain fields itself: graphql-core
        # executed only the resolvers' fields one by one.
        assert CountingPlain.calls * 5 < CountingStock.calls


async def test_the_service_schema_uses_the_plain_field_context(api: Api) -> None:
    await build_cluster(api)

    assert issubclass(service_schema.execution_context_class, PlainFieldExecutionContext)
    data = await api("{ nodes(first: 1) { id gpus { index allocation { shardId } } } }")
    assert data["nodes"][0]["gpus"][0] == {"index": 0, "allocation": {"shardId": "llama-r1-s0"}}


# Broken values, on a throwaway schema: graphql-core's errors, word for word.


@strawberry.enum
class Color(Enum):
    RED = "red"
    BLUE = "blue"


@strawberry.type
class Pet:
    name: str


@strawberry.type
class Robot:
    model: str


@strawberry.type
class Item:
    name: str
    color: Color
    tags: list[str]
    count: int
    note: str | None = None


@strawberry.type
class Holder:
    label: str | None
    item: Item
    maybe_item: Item | None
    items: list[Item]
    friend: Pet | Robot


def item(**fields: Any) -> Item:
    values: dict[str, Any] = {"name": "spanner", "color": Color.RED, "tags": ["a"], "count": 1}
    values.update(fields)
    return Item(**values)


async def later(value: Any) -> Any:
    return value


def holder(**fields: Any) -> Holder:
    values: dict[str, Any] = {
        "label": "h",
        "item": item(),
        "maybe_item": None,
        "items": [item()],
        "friend": Pet(name="rex"),
    }
    values.update(fields)
    return Holder(**values)


# Made anew for each question: a coroutine can be awaited only once.
HOLDERS: dict[str, Callable[[], Holder]] = {
    "fine": lambda: holder(),
    "nullName": lambda: holder(item=item(name=None)),
    "nullNameMaybe": lambda: holder(maybe_item=item(name=None)),
    "badEnum": lambda: holder(item=item(color="purple")),
    "noneInList": lambda: holder(items=[item(), item(tags=["a", None, "c"])]),
    "hugeInt": lambda: holder(items=[item(count=2**40)]),
    "floatInt": lambda: holder(items=[item(count=1.5)]),
    "anError": lambda: holder(label=ValueError("the label broke")),
    "undefined": lambda: holder(label=Undefined, items=[item(note=Undefined)]),
    "awaitable": lambda: holder(label=later("later"), maybe_item=later(item(note="awaited"))),
    "robot": lambda: holder(friend=Robot(model="r2")),
    "notAList": lambda: holder(items=item()),
    "tupleList": lambda: holder(items=(item(), item(name="wrench"))),
}


@strawberry.type
class Query:
    @strawberry.field
    def holder(self, which: str) -> Holder | None:
        return HOLDERS[which]()

    @strawberry.field
    def holders(self) -> list[Holder | None]:
        return [make() for make in HOLDERS.values()]


broken = strawberry.Schema(query=Query)

BROKEN = """
query($which: String!) {
  holder(which: $which) { ...Everything }
}
fragment Everything on Holder {
  __typename label
  item { name color tags count note }
  maybeItem { name color tags note }
  items { __typename name tags count }
  friend { __typename ... on Pet { name } ... on Robot { model } }
}
"""

ALL_BROKEN = """
{
  holders {
    label
    item { name color }
    maybeItem { name }
    items { name tags count }
    friend { ... on Pet { name } ... on Robot { model } }
  }
}
"""


async def test_broken_values_fail_as_graphql_core_says_with_the_same_paths() -> None:
    for which in HOLDERS:
        variables = {"which": which}
        stock = await run(broken._schema, BROKEN, StrawberryGraphQLCoreExecutionContext, variables)
        plain = await run(broken._schema, BROKEN, PlainFieldExecutionContext, variables)
        assert answer(plain) == answer(stock), which

    everything = await run(broken._schema, ALL_BROKEN, PlainFieldExecutionContext)
    assert answer(everything) == answer(
        await run(broken._schema, ALL_BROKEN, StrawberryGraphQLCoreExecutionContext)
    )


async def test_the_errors_are_the_ones_a_client_is_told_about() -> None:
    """Spot checks that the cases above fail at all, and where."""

    async def errors(which: str) -> list[tuple[str, list[str | int] | None]]:
        result = await run(broken._schema, BROKEN, PlainFieldExecutionContext, {"which": which})
        return [(e.message, e.path) for e in result.errors or ()]

    assert await errors("fine") == []
    assert await errors("nullName") == [
        ("Cannot return null for non-nullable field Item.name.", ["holder", "item", "name"])
    ]
    assert await errors("nullNameMaybe") == [
        ("Cannot return null for non-nullable field Item.name.", ["holder", "maybeItem", "name"])
    ]
    assert await errors("badEnum") == [
        ("Enum 'Color' cannot represent value: 'purple'", ["holder", "item", "color"])
    ]
    assert await errors("noneInList") == [
        (
            "Cannot return null for non-nullable field Item.tags.",
            ["holder", "items", 1, "tags", 1],
        )
    ]
    assert await errors("anError") == [("the label broke", ["holder", "label"])]
    assert await errors("awaitable") == []
    awaited = await run(broken._schema, BROKEN, PlainFieldExecutionContext, {"which": "awaitable"})
    assert awaited.data is not None
    assert awaited.data["holder"]["maybeItem"]["note"] == "awaited"


def test_types_served_by_records_find_every_field_on_the_record() -> None:
    """Gpu and Allocation values are the domain's records: a field renamed on one side only
    would answer null or fail, so each field's Python name must be an attribute of its record."""
    from dataclasses import fields as record_fields

    from service.graphql.types import SERVED_BY_RECORDS

    for graphql_type, record in SERVED_BY_RECORDS.items():
        definition = graphql_type.__strawberry_definition__  # type: ignore[attr-defined]
        attributes = {f.name for f in record_fields(record)}
        missing = [f.python_name for f in definition.fields if f.python_name not in attributes]
        assert missing == [], f"{record.__name__} lacks {missing} for {graphql_type.__name__}"
        assert all(f.base_resolver is None for f in definition.fields), "plain fields only"


# A resolver field the fast path knows how to read when its value is already
# at hand (execution.PREFETCHED): the service's Node details on a prefetched page.

resolver_calls: list[str] = []


def _ready_spare(shelf: Shelf, context: Any) -> Any:
    return NOT_READY if shelf.spare is None else shelf.spare


@strawberry.type
class Shelf:
    name: str
    spare: strawberry.Private[Item | None]

    @strawberry.field
    def part(self) -> Item:
        resolver_calls.append(self.name)
        return item(name=f"from the resolver of {self.name}")


@strawberry.type
class ShelfQuery:
    @strawberry.field
    def shelves(self) -> list[Shelf]:
        return [Shelf(name="stocked", spare=item(name="at hand")), Shelf(name="empty", spare=None)]


async def test_a_field_ready_at_hand_skips_its_resolver_and_one_not_ready_calls_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(execution.PREFETCHED, ("Shelf", "part"), _ready_spare)
    shelves = strawberry.Schema(query=ShelfQuery)
    query = "{ shelves { name part { name color } } }"
    resolver_calls.clear()
    stock = await run(shelves._schema, query, StrawberryGraphQLCoreExecutionContext)
    assert resolver_calls == ["stocked", "empty"]

    resolver_calls.clear()
    plain = await run(shelves._schema, query, PlainFieldExecutionContext)

    # The stocked shelf answered from what it holds, the empty one asked its resolver.
    assert resolver_calls == ["empty"]
    assert plain.errors is None and plain.data == {
        "shelves": [
            {"name": "stocked", "part": {"name": "at hand", "color": "RED"}},
            {"name": "empty", "part": {"name": "from the resolver of empty", "color": "RED"}},
        ]
    }
    # Only the prefetched branch differs from the stock answer: the values the resolver gives.
    assert stock.data is not None
    assert stock.data["shelves"][1] == plain.data["shelves"][1]


async def test_each_prefetched_reader_answers_what_its_resolver_answers(
    api: Api, engine: AsyncEngine
) -> None:
    """execution.PREFETCHED reads a Node detail without its resolver: the resolver's own value.

    With the node's details in the request's loaders, each reader gives the
    very object the resolver returns at once; before they are loaded, the
    reader says NOT_READY and the resolver returns an awaitable.
    """
    from service.fleet import node_reads
    from service.graphql.types import Node

    await api(REGISTER, {"input": node_input("gpu-01", gpus=gpus(H100, 2))})
    await api(ALLOCATE, allocation("r1", shard("s1", "gpu-01", 0)))
    async with engine.connect() as conn:
        record = await node_reads.get_node(conn, "gpu-01")
    assert record is not None
    node = Node.of(record)
    resolvers = {
        service_schema.config.name_converter.get_graphql_name(f): f
        for f in Node.__strawberry_definition__.fields  # type: ignore[attr-defined]
    }
    readers = {name: read for (type_name, name), read in execution.PREFETCHED.items()}
    assert {type_name for type_name, _ in execution.PREFETCHED} == {"Node"}

    class Info:
        def __init__(self, context: Any) -> None:
            self.context = context

    context = new_context(engine, Settings())
    for name, read in readers.items():
        field = resolvers[name]
        assert field.base_resolver is not None, name
        later = field.base_resolver.wrapped_func(node, Info(context))
        assert isawaitable(later), name
        later.close()  # type: ignore[attr-defined]
        assert read(node, context) is NOT_READY, name

    async with engine.connect() as conn:
        await context.loaders.prefetch_nodes(conn, ["gpu-01"], [])
        for loader in ("gpus", "fabrics", "filesystems", "weights", "shards_on_node"):
            await context.loaders.prefetch(conn, getattr(context.loaders, loader), ["gpu-01"])
    for name, read in readers.items():
        field = resolvers[name]
        assert field.base_resolver is not None
        answered = field.base_resolver.wrapped_func(node, Info(context))
        assert not isawaitable(answered), name
        assert read(node, context) is answered, name
    assert [a.shard_id for a in readers["allocations"](node, context)] == ["s1"]
