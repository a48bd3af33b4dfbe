"""The fast path's front door: which route answers a GraphQL request, decided from one table.

The GraphQL endpoint (service/web/graphql_endpoint.py) asks it after the
guards (time limit, body size, token check) and the request's checks, so the
body is already read and parsed and the caller's Principal is in the scope's
state. Strawberry's view (the reference) stands behind it: whatever the front
door or a route declines is replayed to the view unchanged.

The front door itself declines (route `front_door`, Strawberry's view
answers), with these reasons:

| reason | the request |
| --- | --- |
| extension_not_honoured | any: the schema has an extension the fast path cannot honour (extensions.py) |
| not_a_json_post | GET, GraphiQL, multipart, or an Accept asking for a stream |
| body_not_ordinary | not a JSON object of `query`, optional object `variables`, string `operationName` (batches, `extensions`, malformed JSON) |
| document_not_valid | parse or validation errors: Strawberry's words |
| operation_not_found | no operation of that name, or several and no name |
| subscription | a subscription (only Strawberry's view streams) |

Every other request is a prepared document's query or mutation (documents.py:
parsed and validated once, by the schema's own rules and limits). Its
operation's route is the first of ROUTES that compiles it, once per document,
and graphql_core stands after it:

| route | covers | why it is exact | declines (then graphql_core answers) |
| --- | --- | --- | --- |
| heartbeat (compiled_heartbeat.py) | the agents' `heartbeat` mutation selecting leaves of Node that the beat returns (types.BEAT_FIELDS) | the resolver's domain call and role check, the schema's serializers per leaf | node_id_not_a_string, refused, beat_failed, leaf_not_serializable |
| registration (compiled_registration.py) | the agents' `registerNode` with its input in a variable, selecting leaves of Node | the variable plan of graphql_core, Strawberry's argument conversion, the resolver's role check and write (mutations.store_report), the schema's serializers per leaf | variables_for_graphql_core, refused, register_failed, leaf_not_serializable |
| place (compiled_place.py) | the schedulers' `place`, its input a variable, a literal or a literal holding variables, selecting `__typename` and inline fragments on the PlaceResult union's members, with their plain fields and lists | the variable plan of graphql_core and graphql-core's get_argument_values, Strawberry's argument conversion, the role check, the resolver's own steps (allocation_mutations: place_outcome, place_result, count_place), execution.py's plain-field completers | variables_for_graphql_core, arguments_for_graphql_core, refused, place_failed, leaf_not_serializable |
| page (compiled_page.py) | `nodes` and `freeGpus` pages selecting what PostgreSQL can build as JSON (node_pages.py) | the resolver's role check, page size and page query; each field's record attribute read from the Strawberry types (fields.py) | arguments_for_graphql_core, refused, database_unavailable, text_not_storable |
| node (compiled_node.py) | `node(id)` with a string id (literal or the one ID! variable), selecting what the page builds | the resolver's role check and node by id, built by the page's statement builder (node_pages.OneNode); looks that arrive together read in one statement (batches.py) | id_for_graphql_core, refused, database_unavailable, text_not_storable |
| graphql_core (direct.py) | every query and mutation of a valid document | graphql-core executing the schema's own resolvers and execution context; the extensions' rules, limits and masking | never (reason variables_coerced_by_graphql_core when its variable plan declined) |

Beneath every route, and Strawberry's view too while the switch is on:
plain fields completed without graphql-core's per-field machinery
(execution.py) and input objects built by compiled converters
(input_conversion.py), each declining to graphql-core's own code for any
value it would not treat exactly as graphql-core does.

A route sees the request as a FastRequest (fast_request.py): the caller,
the engine and the settings, and the request's GraphQL Context made only
when something needs it (graphql_core, a hand-over, a domain call that
takes a Context), which a heartbeat does not.

A route answers or declines with a reason (outcomes.py); a compiled route's
decline passes the request to graphql_core, which always answers. Each run is
counted after it ran: inventory_fast_path_requests_total{route, outcome,
reason} (service/metrics.py). A declined mutation never writes twice: a route
that declines after writing hands the write's outcome to the resolver
(Context.hand_over). An exception a route raises is a bug: it is logged with
its traceback, counted (reason `bug`) and answered as an internal error,
as masking.py answers any bug; it is never retried by another route, which
could write a second time.

The switch (switch.py): with INVENTORY_DIRECT_EXECUTION=false the app has no
front door and every request is Strawberry's view's alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import strawberry
from graphql import OperationDefinitionNode, OperationType

from service.graphql.masking import INTERNAL_ERROR
from service.metrics import count_fast_path
from service.web.http_guards import Receive, Scope, header

from .compiled_heartbeat import compile_heartbeat
from .compiled_node import compile_node
from .compiled_page import compile_page
from .compiled_place import compile_place
from .compiled_registration import compile_registration
from .direct import DirectOperation
from .documents import Prepared, PreparedDocuments
from .extensions import read_extensions
from .fast_request import FastRequest
from .outcomes import Answered, CompiledRoute, Outcome, encode
from .private_api import core_schema

log = logging.getLogger(__name__)

FRONT_DOOR: Final = "front_door"
GRAPHQL_CORE: Final = "graphql_core"

Compile = Callable[[strawberry.Schema, OperationDefinitionNode], CompiledRoute | None]

# The one table: route name -> what compiles an operation for it (None: not
# this route's shape), in the order they are tried. graphql_core follows.
ROUTES: Final[tuple[tuple[str, Compile], ...]] = (
    ("heartbeat", compile_heartbeat),
    ("registration", compile_registration),
    ("place", compile_place),
    ("page", compile_page),
    ("node", compile_node),
)

_KNOWN_KEYS = frozenset({"query", "variables", "operationName"})


class Plan:
    """An operation's route (if one compiled it) and graphql_core after it."""

    __slots__ = ("direct", "first")

    def __init__(self, first: tuple[str, CompiledRoute] | None, direct: DirectOperation) -> None:
        self.first = first
        self.direct = direct


def plan_operation(
    schema: strawberry.Schema,
    prepared: Prepared,
    operation: OperationDefinitionNode,
    operation_name: str | None,
) -> Plan:
    first = None
    for name, compile_route in ROUTES:
        compiled = compile_route(schema, operation)
        if compiled is not None:
            first = (name, compiled)
            break
    return Plan(first, DirectOperation(schema, prepared, operation, operation_name))


def _is_plain_json_post(scope: Scope) -> bool:
    if scope.get("method") != "POST":
        return False
    content_type = header(scope, b"content-type") or ""
    accept = header(scope, b"accept") or ""
    # multipart/mixed asks for incremental delivery, which only Strawberry's
    # view streams.
    return content_type.split(";")[0].strip().lower() == "application/json" and (
        "multipart" not in accept.lower()
    )


def _ordinary(request: object) -> tuple[str, str | None, dict[str, Any] | None] | None:
    """(query, operationName, variables) of an ordinary request body, else None."""
    if not isinstance(request, dict) or not _KNOWN_KEYS.issuperset(request):
        return None
    query = request.get("query")
    operation_name = request.get("operationName")
    variables = request.get("variables")
    if not isinstance(query, str):
        return None
    if operation_name is not None and not isinstance(operation_name, str):
        return None
    if variables is not None and not isinstance(variables, dict):
        return None
    return query, operation_name, variables


class FrontDoor:
    """What answers a GraphQL request before Strawberry's view, or declines it to the view."""

    def __init__(
        self,
        schema: strawberry.Schema,
        request_for: Callable[[Scope, Receive], FastRequest],
    ) -> None:
        self.schema = schema
        self.request_for = request_for
        extensions = read_extensions(schema)
        self.not_honoured = extensions.not_honoured
        if self.not_honoured:
            log.warning(
                "fast path off: the schema's extensions %s are not honoured by it "
                "(service/graphql/fast/extensions.py); Strawberry's view answers every request",
                ", ".join(self.not_honoured),
            )
        self.documents = PreparedDocuments(
            core_schema(schema), extensions.rules, extensions.max_tokens
        )

    def plan(self, prepared: Prepared, operation_name: str | None) -> Plan | None:
        """The plan of the operation a request names, None when the front door declines it."""
        if operation_name not in prepared.plans:
            operation = prepared.operation(operation_name)
            prepared.plans[operation_name] = (
                None
                if operation is None or operation.operation == OperationType.SUBSCRIPTION
                else plan_operation(self.schema, prepared, operation, operation_name)
            )
        plan: Plan | None = prepared.plans[operation_name]
        return plan

    async def answer(self, scope: Scope, receive: Receive, request: object) -> bytes | None:
        """The answer's body (status 200, JSON), or None: declined and counted, for Strawberry's view.

        `request` is the body as service/web/graphql_http.check_request parsed
        and checked it (None for a GET).
        """
        if self.not_honoured:
            return _declined("extension_not_honoured")
        if not _is_plain_json_post(scope):
            return _declined("not_a_json_post")
        ordinary = _ordinary(request)
        if ordinary is None:
            return _declined("body_not_ordinary")
        query, operation_name, variables = ordinary
        prepared = self.documents.get(query)
        if prepared is None:
            return _declined("document_not_valid")
        plan = self.plan(prepared, operation_name)
        if plan is None:
            operation = prepared.operation(operation_name)
            return _declined("operation_not_found" if operation is None else "subscription")
        return await self._answer(plan, variables, self.request_for(scope, receive))

    async def _answer(
        self, plan: Plan, variables: dict[str, Any] | None, request: FastRequest
    ) -> bytes:
        route = GRAPHQL_CORE
        try:
            if plan.first is not None:
                route, compiled = plan.first
                outcome = await compiled.run(variables, request)
                _count(route, outcome)
                if isinstance(outcome, Answered):
                    return outcome.body
                route = GRAPHQL_CORE
            answered = await plan.direct.run(variables, request.context())
            _count(route, answered)
            return answered.body
        except Exception:
            request_id = request.context().request_id
            log.exception(
                "bug in the fast path's %s route (request %s): answered as an internal error",
                route,
                request_id,
            )
            _count(route, None)
            return encode(
                {
                    "data": None,
                    "errors": [
                        {
                            "message": INTERNAL_ERROR,
                            "extensions": {
                                "code": "INTERNAL_ERROR",
                                "requestId": request_id,
                            },
                        }
                    ],
                }
            )


def _declined(reason: str) -> bytes | None:
    """No answer from the front door (Strawberry's view answers), counted with its reason."""
    count_fast_path(FRONT_DOOR, "declined", reason)
    return None


def _count(route: str, outcome: Outcome | None) -> None:
    """Count a route's run once it ran; None: it raised (a bug)."""
    if outcome is None:
        count_fast_path(route, "declined", "bug")
    elif isinstance(outcome, Answered):
        count_fast_path(route, "answered", outcome.reason)
    else:
        count_fast_path(route, "declined", outcome.reason)
