"""One node by id, compiled: PostgreSQL builds the object's JSON (service/graphql/fast/json_pages.py).

Why: `node(id)` is the dashboard's and `ctl node`'s look at one node, and a
scheduler's. Through graphql-core it costs the executor, Strawberry's
resolvers, and two statements one after the other (the node through its
loader, then its GPUs through theirs), many times a bare endpoint's cost.
Here PostgreSQL builds the object's JSON text, passed through; and looks
that arrive together are read in one statement (service/batches.py, as
heartbeats are written): one statement and one pool checkout per look
would make the round trip most of the route's cost.

Which documents: a query with one root field, `node`, whose `id` is a
string literal or the one variable (ID!, no default), selecting what the
compiled page builds for a node (compiled_page.compile_selection: leaves,
timestamps, disks, detail lists, nvlinkGroups...; aliases and __typename;
no directives, fragments or repeated keys). Everything else goes to
graphql-core.

How it stays exact: the gate (front_door.py), and the node the resolver's
loader reads (node_reads.get_nodes: by id, the object or null) built by the
same statement builder as a page (json_pages.OneNode, the page's own
expressions per attribute; tests/fast_path/test_compiled_page.py compares both ways).
A batch's statement starts after each look it carries arrived, so each sees
what was committed before it, as its own statement would; a batch that fails
fails each look, which declines as below.
Declined with a reason, graphql-core then answering as usual (a read, so
running it again writes nothing): an id that is not a JSON string (an ID
sent as a number is graphql-core's to coerce) or a variable left out
(id_for_graphql_core), a caller the role check refuses (refused), a
database that is down or an id it cannot store (outcomes.compiled_read).
"""

from __future__ import annotations

import json
from typing import Any

import strawberry
from graphql import (
    FieldNode,
    GraphQLObjectType,
    NamedTypeNode,
    NonNullTypeNode,
    OperationDefinitionNode,
    OperationType,
    StringValueNode,
    VariableNode,
    get_named_type,
)
from sqlalchemy.ext.asyncio import AsyncEngine

from service.batches import Batches
from service.database import read_routing
from service.database.connections import NativeConnection
from service.database.read_routing import Replica
from service.graphql.private_api import core_schema

from . import json_pages
from .compiled_page import compile_selection
from .documents import only_root_field
from .fast_request import FastRequest
from .outcomes import Answered, Declined, Outcome, compiled_read

FIELD = "node"


# At most this many ids per statement, so one statement stays small. Looks
# that arrive together share a statement and a pool checkout
# (benchmarks/floor.py measures it); a lone look is read at once.
MAX_BATCH = 100


def _no_node(node_id: str) -> None:
    return None


class CompiledNode:
    def __init__(
        self, key: str, node_id: str | None, variable: str | None, node: json_pages.OneNode
    ) -> None:
        self._node_id = node_id
        self._variable = variable
        self._node = node
        self._start = b'{"data":{' + json.dumps(key).encode() + b":"
        # By engine (one per app, as the app's front door holds this route)
        # and by where the look reads: the primary (None) or a read replica.
        self._batches: dict[
            tuple[AsyncEngine, Replica | None], Batches[NativeConnection, str, str | None]
        ] = {}

    def _batches_of(
        self, engine: AsyncEngine, replica: Replica | None
    ) -> Batches[NativeConnection, str, str | None]:
        batches = self._batches.get((engine, replica))
        if batches is None:
            batches = self._batches[engine, replica] = Batches(
                lambda: read_routing.connect(engine, replica),
                self._node.fetch,
                _no_node,
                MAX_BATCH,
            )
        return batches

    def arguments(self, variables: dict[str, Any] | None) -> dict[str, Any] | Declined:
        node_id = self._node_id
        if node_id is None:
            node_id = (variables or {}).get(self._variable or "")
            if type(node_id) is not str:
                return Declined("id_for_graphql_core")
        return {"id": node_id}

    async def run(self, arguments: dict[str, Any], request: FastRequest) -> Outcome:
        node_id: str = arguments["id"]

        async def read() -> str | None:
            # Where the request's reads go, decided per look (read_routing.route);
            # a look that fails on a replica declines, and graphql-core's
            # read falls back to the primary.
            choice = read_routing.route(request.engine)
            replica = None if choice is None else choice.replica
            found = await self._batches_of(request.engine, replica).ask(node_id)
            read_routing.record(choice)
            return found

        found = await compiled_read(read)
        if isinstance(found, Declined):
            return found
        return Answered(self._start + (b"null" if found is None else found.encode()) + b"}}")


def _id_argument(
    operation: OperationDefinitionNode, root: FieldNode
) -> tuple[str | None, str | None] | None:
    """(literal id, None) or (None, variable name) for the shapes compiled, else None.

    The document is valid (documents.py), so a variable in `id: ID!` is
    declared ID! or has a default; only the first is taken, and it must be
    the operation's only variable.
    """
    arguments = root.arguments or ()
    if len(arguments) != 1 or arguments[0].name.value != "id":
        return None
    value = arguments[0].value
    if isinstance(value, StringValueNode):
        return None if operation.variable_definitions else (value.value, None)
    if not isinstance(value, VariableNode):
        return None
    definitions = operation.variable_definitions or ()
    if len(definitions) != 1:
        return None
    definition = definitions[0]
    declared = definition.type
    if (
        definition.variable.name.value != value.name.value
        or definition.default_value is not None
        or definition.directives
        or not isinstance(declared, NonNullTypeNode)
        or not isinstance(declared.type, NamedTypeNode)
        or declared.type.name.value != "ID"
    ):
        return None
    return None, value.name.value


def compile_node(
    schema: strawberry.Schema, operation: OperationDefinitionNode
) -> CompiledNode | None:
    """A CompiledNode for an operation of the shape above, else None."""
    root = only_root_field(operation, OperationType.QUERY)
    query = core_schema(schema).query_type
    if root is None or root.name.value != FIELD or query is None:
        return None
    node_type = get_named_type(query.fields[FIELD].type)
    argument = _id_argument(operation, root)
    if argument is None or not isinstance(node_type, GraphQLObjectType):
        return None
    values = compile_selection(schema, node_type, root.selection_set)
    if values is None:
        return None
    try:
        node = json_pages.OneNode(values)
    except json_pages.Unsupported:
        return None
    key = root.alias.value if root.alias else FIELD
    return CompiledNode(key, *argument, node)
