"""One gate for every compiled route: the function Strawberry's RequireRole calls, before any route runs.

A compiled route answers without Strawberry's field extensions, so the
front door runs the gate itself (service/graphql/fast/front_door.py). These
stories put a spy route in front of the real ones and check that a caller
the gate refuses never reaches it, that the refusal is worded as Strawberry's
view words it, and that a route cannot be built without a role to check.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import strawberry
from graphql import OperationDefinitionNode
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from service.config import Settings
from service.graphql.fast import front_door
from service.graphql.fast.fast_request import FastRequest
from service.graphql.fast.outcomes import Answered, Declined, Outcome
from service.graphql.schema import schema
from service.metrics import COUNTERS
from service.web.app import create_app
from tests.support.module_imports import _module_imports

ROOT = Path(__file__).resolve().parents[2]


class Spy:
    """A compiled route that answers every nodes query with an empty page and records its runs."""

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self.runs = runs

    def arguments(self, variables: dict[str, Any] | None) -> dict[str, Any] | Declined:
        return {"first": (variables or {}).get("first")}

    async def run(self, arguments: dict[str, Any], request: FastRequest) -> Outcome:
        self.runs.append(arguments)
        return Answered(b'{"data":{"nodes":[]}}')


@pytest.fixture
async def spied(
    engine: AsyncEngine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[httpx.AsyncClient, list[dict[str, Any]]]]:
    """An app whose front door tries the spy route first, for `Query.nodes`."""
    runs: list[dict[str, Any]] = []

    def compile_spy(schema: strawberry.Schema, operation: OperationDefinitionNode) -> Spy:
        return Spy(runs)

    spy = front_door.Route("spy", ("Query.nodes",), compile_spy)
    monkeypatch.setattr(front_door, "ROUTES", (spy, *front_door.ROUTES))
    app = create_app(settings, engine=engine)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://inventory"
    ) as client:
        yield client, runs


async def _token(engine: AsyncEngine, role: str, node_id: str | None = None) -> dict[str, str]:
    async with engine.begin() as conn:
        created = await tokens.create_token(conn, role, node_id, description=f"test {role}")
    return {"Authorization": f"Bearer {created.secret}"}


QUERY = "query Q($first: Int) { nodes(first: $first) { id } }"


async def test_a_caller_the_gate_admits_reaches_the_route(
    spied: tuple[httpx.AsyncClient, list[dict[str, Any]]], engine: AsyncEngine
) -> None:
    client, runs = spied
    reader = await _token(engine, "reader")
    answer = await client.post(
        "/graphql", json={"query": QUERY, "variables": {"first": 5}}, headers=reader
    )
    assert answer.json() == {"data": {"nodes": []}}
    assert runs == [{"first": 5}]


@pytest.mark.parametrize(
    ("role", "first", "code"),
    [
        ("agent", 5, "FORBIDDEN"),  # the role: an agent may not list nodes
        ("reader", 0, "BAD_INPUT"),  # the page size: 1 to INVENTORY_MAX_PAGE_SIZE
        ("reader", 1_000_000, "BAD_INPUT"),
    ],
)
async def test_a_caller_the_gate_refuses_never_reaches_the_route(
    spied: tuple[httpx.AsyncClient, list[dict[str, Any]]],
    engine: AsyncEngine,
    role: str,
    first: int,
    code: str,
) -> None:
    client, runs = spied
    headers = await _token(engine, role, "gpu-01" if role == "agent" else None)
    body = {"query": QUERY, "variables": {"first": first}}
    answer = (await client.post("/graphql", json=body, headers=headers)).json()
    assert runs == []
    # Worded by graphql-core running the resolver behind RequireRole: the same gate.
    assert answer["data"] is None
    (error,) = answer["errors"]
    assert error["extensions"]["code"] == code
    assert error["path"] == ["nodes"]


async def test_an_agent_may_beat_only_for_its_own_node_on_the_compiled_route(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """The node binding: checked by the gate, with the route's arguments as the resolver gets them."""
    before = COUNTERS.snapshot()[2]
    headers = await _token(engine, "agent", "gpu-01")
    beat = "mutation B($id: ID!) { heartbeat(nodeId: $id) { id } }"
    answer = await client.post(
        "/graphql", json={"query": beat, "variables": {"id": "gpu-02"}}, headers=headers
    )
    (error,) = answer.json()["errors"]
    assert error["extensions"]["code"] == "FORBIDDEN"
    assert "cannot act for node 'gpu-02'" in error["message"]
    refused = ("heartbeat", "declined", "refused")
    assert COUNTERS.snapshot()[2].get(refused, 0) - before.get(refused, 0) == 1


def _never(schema: strawberry.Schema, operation: OperationDefinitionNode) -> None:
    return None


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ((), "declares no root field"),
        (("Query.notARootField",), "Query.notARootField"),
        (("Mutation.heartbeat", "Query.nothingHere"), "Query.nothingHere"),
    ],
)
def test_a_route_without_a_role_declaration_cannot_be_built_into_the_front_door(
    fields: tuple[str, ...], named: str
) -> None:
    undeclared = front_door.Route("undeclared", fields, _never)
    with pytest.raises(front_door.UndeclaredRole, match=named):
        front_door.FrontDoor(
            schema,
            lambda: None,
            Settings(),
            (*front_door.ROUTES, undeclared),  # type: ignore[arg-type,return-value]
        )


def test_every_route_of_the_table_declares_roles_for_its_fields() -> None:
    roles = front_door.declared_roles(front_door.ROUTES)
    assert roles["heartbeat"] == {"Mutation.heartbeat": "agent"}
    assert roles["page"] == {"Query.nodes": "reader", "Query.freeGpus": "reader"}
    assert set(roles) == {route.name for route in front_door.ROUTES}


def test_no_compiled_route_checks_roles_itself() -> None:
    """The gate is the front door's: a route's own check could drift from Strawberry's."""
    fast = ROOT / "service" / "graphql" / "fast"
    calling = sorted(
        path.name
        for path in fast.glob("*.py")
        if "check_role" in path.read_text() or "role_of" in path.read_text()
    )
    assert calling == ["front_door.py"]


def _imported_with(fast_path: str) -> list[str]:
    """The fast path's modules a process has loaded once it built the app with the switch so."""
    program = (
        "import sys\n"
        "from service.config import Settings\n"
        "from service.web.app import create_app\n"
        "create_app(Settings.from_env(), database_url='postgresql://unused/x')\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('service.graphql.fast'))))\n"
    )
    env = {**os.environ, "INVENTORY_FAST_PATH": fast_path}
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.process
def test_switched_off_the_fast_package_is_not_even_imported() -> None:
    assert _imported_with("false") == []
    # Switched on, the app installs it: the check above can fail.
    assert "service.graphql.fast.front_door" in _imported_with("true")


def test_no_module_outside_the_fast_package_imports_it_when_loaded() -> None:
    """The schema and the web layer load without it: app.py imports it only when switched on."""
    service = ROOT / "service"
    fast = service / "graphql" / "fast"
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in _module_imports(path) if m.startswith("service.graphql.fast")
        )
        for path in sorted(service.rglob("*.py"))
        if fast not in path.parents
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_fast_package_reads_no_asgi_scope() -> None:
    """It is handed the body and the caller: nothing of the web layer or Starlette."""
    offenders = {}
    for path in sorted((ROOT / "service" / "graphql" / "fast").glob("*.py")):
        imported = {
            node.module or ""
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom)
        } | {
            alias.name
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        upward = sorted(m for m in imported if m.startswith(("service.web", "starlette")))
        if upward:
            offenders[path.name] = upward
    assert offenders == {}


# Words by which a module would know the fast path: its package, its routes,
# its hand-over (issue 45: the resolvers carried hand-over hooks, types.py its
# metadata).
_FAST_PATH_WORDS = (
    "graphql/fast",
    "graphql.fast",
    "fast path",
    "fast route",
    "compiled ",
    "hand_over",
    "hand over",
    "handed over",
    "hands over",
)


def test_the_resolvers_and_the_types_know_nothing_of_the_fast_path() -> None:
    """The fast path stays in its room: what it needs of the schema it keeps itself
    (fields.RECORD_ATTRIBUTES, execution.PREFETCHED) or applies from its side
    (hand_over.py), so removing it changes nothing in these modules."""
    graphql = ROOT / "service" / "graphql"
    modules = [
        *sorted((graphql / "operations").glob("*.py")),
        *sorted(graphql.glob("*types.py")),
        graphql / "context.py",
        graphql / "loaders.py",
        graphql / "inputs.py",
    ]
    knowing = {
        str(path.relative_to(ROOT)): [w for w in _FAST_PATH_WORDS if w in path.read_text().lower()]
        for path in modules
    }
    assert {name: words for name, words in knowing.items() if words} == {}
