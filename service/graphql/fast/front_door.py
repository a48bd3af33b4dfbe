"""The fast path's front door: which route answers a GraphQL request, decided from one table.

The GraphQL endpoint (service/web/graphql_endpoint.py) asks it after the
guards (time limit, body size, token check) and the request's checks, and
hands it what those found: the parsed body, whether the request is a plain
JSON POST, the caller's Principal and a way to make the request's GraphQL
Context. The front door reads no ASGI scope. Strawberry's view (the
reference) stands behind it: whatever the front door or a route declines is
replayed to the view unchanged.

The front door itself declines (route `front_door`, Strawberry's view
answers), with these reasons:

| reason | the request |
| --- | --- |
| extension_not_honoured | any: the schema has an extension the fast path cannot honour (extensions.py) |
| not_a_json_post | GET, GraphiQL, multipart, or an Accept asking for a stream |
| body_not_ordinary | not a JSON object of `query`, optional object `variables`, string `operationName` (batches, `extensions`, malformed JSON) |
| document_not_valid | parse or validation errors: Strawberry's words |
| operation_not_found | no operation of that name, or several and no name (GraphQL's error, checked_documents.py) |
| subscription | a subscription (only Strawberry's view streams) |
| text_not_storable | a String or ID variable breaks the rule of text that can be stored, or an ID its bound (input_values.py): Strawberry's view refuses it, from the same check |
| list_too_long | a list in the variables is longer than its bound (list_bounds.py), read before any entry is: Strawberry's view refuses it, from the same check, before coercing anything |

Every other request is a prepared document's query or mutation (documents.py:
parsed and validated once, by the schema's own rules and limits). Its
operation's route is the first of ROUTES that declares the operation's root
field and compiles it, once per document, and graphql_core stands after it.

The gate: before any compiled route runs, the front door passes the root
field's arguments (the route's `arguments`, as the resolver would receive
them) through permissions.check_role, the function Strawberry's RequireRole
calls: the token, the role (from permissions.ROOT_FIELD_ROLES, for the root
field the route declares), the node an agent may name, the page size. A
caller it refuses is declined (reason `refused`) and graphql_core words the
refusal as the resolver would. A route cannot opt out: it runs only through
the front door, only after the gate, and the front door refuses to be built
with a route that declares no root field or one without a role
(UndeclaredRole).

| route | covers | why it is exact | declines (then graphql_core answers) |
| --- | --- | --- | --- |
| heartbeat (compiled_heartbeat.py) | the agents' `heartbeat` mutation selecting leaves of Node that the beat returns (compiled_heartbeat.BEAT_FIELDS) | the gate, the resolver's domain call, the schema's serializers per leaf | node_id_not_a_string, refused, beat_failed, leaf_not_serializable |
| registration (compiled_registration.py) | the agents' `registerNode` with its input in a variable, selecting leaves of Node | the variable plan of graphql_core, Strawberry's argument conversion, the gate, the resolver's write (mutations.store_report), the schema's serializers per leaf | variables_for_graphql_core, refused, register_failed, leaf_not_serializable |
| place (compiled_place.py) | the schedulers' `place`, its input a variable, a literal or a literal holding variables, selecting `__typename` and inline fragments on the PlaceResult union's members, with their plain fields and lists | the variable plan of graphql_core and graphql-core's get_argument_values, Strawberry's argument conversion, the gate, the resolver's own steps (allocation_mutations: place_outcome, place_result, count_place), execution.py's plain-field completers | variables_for_graphql_core, arguments_for_graphql_core, refused, place_failed, leaf_not_serializable |
| page (compiled_page.py) | `nodes` and `freeGpus` pages selecting what PostgreSQL can build as JSON (service/graphql/fast/json_pages.py) | the gate, the resolver's argument mapping (operations/queries.py) and page query; each field's record attribute read from the Strawberry types (fields.py) | arguments_for_graphql_core, refused, database_unavailable, statement_timeout, text_not_storable |
| node (compiled_node.py) | `node(id)` with a string id (literal or the one ID! variable), selecting what the page builds | the gate, the resolver's node by id, built by the page's statement builder (json_pages.OneNode); looks that arrive together read in one statement (batches.py) | id_for_graphql_core, refused, database_unavailable, statement_timeout, replica_failed, text_not_storable |
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
that declines after writing hands the write's outcome to graphql_core's run
of the document (hand_over.py), whose resolver wrapper answers from it; the
resolvers know nothing of it. An exception a route raises is a bug: it is logged with
its traceback, counted (reason `bug`) and answered as an internal error,
as masking.py answers any bug; it is never retried by another route, which
could write a second time. The database's expected outcomes are not bugs
(unavailable, a statement cancelled at its statement_timeout): answered with
their code in one log line, as masking.py answers them.

The switch (switch.py): with INVENTORY_FAST_PATH=false the app has no
front door, the fast package is not even imported (install.py is the one
way in, called when the app is built) and every request is Strawberry's
view's alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import strawberry
from graphql import OperationDefinitionNode, OperationType
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control.auth import Principal
from service.config import Settings
from service.database import request_state
from service.errors import InventoryError, TooManyEntries
from service.graphql.context import Context
from service.graphql.input_values import InputCheck
from service.graphql.masking import INTERNAL_ERROR, expected_outcome, log_expected_outcome
from service.graphql.permissions import ROOT_FIELD_ROLES, Roles, check_role
from service.graphql.private_api import core_schema
from service.graphql.read_routes import allows_stale_reads
from service.metrics import count_fast_path

from .compiled_heartbeat import compile_heartbeat
from .compiled_node import compile_node
from .compiled_page import compile_page
from .compiled_place import compile_place
from .compiled_registration import compile_registration
from .direct import DirectOperation
from .documents import Prepared, PreparedDocuments, only_root_field
from .extensions import read_extensions
from .fast_request import FastRequest
from .fields import check_record_attributes
from .hand_over import answer_handed_over
from .outcomes import Answered, CompiledRoute, Declined, Outcome, encode

log = logging.getLogger(__name__)

FRONT_DOOR: Final = "front_door"
GRAPHQL_CORE: Final = "graphql_core"

Compile = Callable[[strawberry.Schema, OperationDefinitionNode], CompiledRoute | None]

_ROOT_TYPES: Final = {
    OperationType.QUERY: "Query",
    OperationType.MUTATION: "Mutation",
    OperationType.SUBSCRIPTION: "Subscription",
}


@dataclass(frozen=True)
class Route:
    """A compiled route: its name (a metrics label), the root fields it may answer, its compiler.

    `fields` ("Type.field") is the route's role declaration: the gate takes
    each field's role from permissions.ROOT_FIELD_ROLES, and the route is
    never tried for an operation whose root field it does not declare.
    """

    name: str
    fields: tuple[str, ...]
    compile: Compile


# The one table: the routes in the order they are tried. graphql_core follows.
ROUTES: Final[tuple[Route, ...]] = (
    Route("heartbeat", ("Mutation.heartbeat",), compile_heartbeat),
    Route("registration", ("Mutation.registerNode",), compile_registration),
    Route("place", ("Mutation.place",), compile_place),
    Route("page", ("Query.nodes", "Query.freeGpus"), compile_page),
    Route("node", ("Query.node",), compile_node),
)

_KNOWN_KEYS = frozenset({"query", "variables", "operationName"})


class UndeclaredRole(Exception):
    """A route that does not say which root fields it answers, or names one without a role."""


def declared_roles(routes: Sequence[Route]) -> dict[str, dict[str, Roles]]:
    """Route name -> "Type.field" -> role, each from ROOT_FIELD_ROLES; UndeclaredRole if missing.

    A field missing from the table would be gated as UNLISTED_ROLE by
    Strawberry's view; a compiled route is not built on such a fallback.
    """
    declared: dict[str, dict[str, Roles]] = {}
    for route in routes:
        if not route.fields:
            raise UndeclaredRole(f"route {route.name!r} declares no root field")
        roles = declared[route.name] = {}
        for field in route.fields:
            type_name, _, name = field.partition(".")
            role = ROOT_FIELD_ROLES.get(type_name, {}).get(name)
            if role is None:
                raise UndeclaredRole(
                    f"route {route.name!r} declares {field}, which has no role in "
                    "service/graphql/permissions.py ROOT_FIELD_ROLES"
                )
            roles[field] = role
    return declared


@dataclass(frozen=True, slots=True)
class Gated:
    """A compiled route with what the gate checks before it runs."""

    name: str
    route: CompiledRoute
    field: str  # the GraphQL name of the root field
    role: Roles


class Plan:
    """An operation's route (if one compiled it), graphql_core after it, whether its reads
    may go to a read replica (read_routes.allows_stale_reads: the verdict Strawberry's view's
    ReadRouting extension gives the same operation), and the check of its String and ID
    variables' texts and lists (input_values.InputCheck, None when it has none)."""

    __slots__ = ("direct", "first", "inputs", "stale_reads")

    def __init__(
        self,
        first: Gated | None,
        direct: DirectOperation,
        stale_reads: bool,
        inputs: InputCheck | None,
    ) -> None:
        self.first = first
        self.direct = direct
        self.stale_reads = stale_reads
        self.inputs = inputs


def plan_operation(
    schema: strawberry.Schema,
    prepared: Prepared,
    operation: OperationDefinitionNode,
    operation_name: str | None,
    routes: Sequence[Route],
    roles: dict[str, dict[str, Roles]],
) -> Plan:
    first = None
    root = only_root_field(operation, operation.operation)
    if root is not None:
        field = f"{_ROOT_TYPES[operation.operation]}.{root.name.value}"
        for route in routes:
            role = roles[route.name].get(field)
            if role is None:
                continue
            compiled = route.compile(schema, operation)
            if compiled is not None:
                first = Gated(route.name, compiled, root.name.value, role)
                break
    return Plan(
        first,
        DirectOperation(schema, prepared, operation, operation_name),
        allows_stale_reads(operation),
        prepared.checked.input_check(core_schema(schema), operation_name),
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
        engine: Callable[[], AsyncEngine],
        settings: Settings,
        routes: Sequence[Route] | None = None,
    ) -> None:
        self.schema = schema
        self.engine = engine
        self.settings = settings
        self.routes = ROUTES if routes is None else tuple(routes)
        self.roles = declared_roles(self.routes)
        # The fields a page answers from its records, checked against the schema.
        check_record_attributes(schema)
        # A route that declines after its write hands it over (hand_over.py).
        answer_handed_over(schema, [field for route in self.routes for field in route.fields])
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
                else plan_operation(
                    self.schema, prepared, operation, operation_name, self.routes, self.roles
                )
            )
        plan: Plan | None = prepared.plans[operation_name]
        return plan

    async def answer(
        self,
        request: object,
        plain_json_post: bool,
        principal: Principal | None,
        make_context: Callable[[], Context],
    ) -> bytes | None:
        """The answer's body (status 200, JSON), or None: declined and counted, for Strawberry's view.

        `request` is the body as service/web/graphql_http.check_request parsed
        and checked it (None for a GET); `plain_json_post`: a POST of
        application/json that asks for no stream (multipart/mixed asks for
        incremental delivery, which only Strawberry's view streams);
        `principal`: the caller the endpoint's token check found;
        `make_context`: the request's GraphQL Context, made when something
        needs it (fast_request.py).
        """
        if self.not_honoured:
            return _declined("extension_not_honoured")
        if not plain_json_post:
            return _declined("not_a_json_post")
        ordinary = _ordinary(request)
        if ordinary is None:
            return _declined("body_not_ordinary")
        query, operation_name, variables = ordinary
        prepared = await self.documents.get(query)
        if prepared is None:
            return _declined("document_not_valid")
        plan = self.plan(prepared, operation_name)
        if plan is None:
            operation = prepared.operation(operation_name)
            return _declined("operation_not_found" if operation is None else "subscription")
        refused = None if plan.inputs is None else plan.inputs.refusal(variables)
        if refused is not None:
            # Strawberry's view words the refusal (checked_documents.py), from the same check.
            too_long = isinstance(refused.original_error, TooManyEntries)
            return _declined("list_too_long" if too_long else "text_not_storable")
        state = request_state.current()
        if state is not None:
            state.replica_allowed = plan.stale_reads
        fast = FastRequest(principal, self.engine(), self.settings, make_context)
        return await self._answer(plan, variables, fast)

    def _gate(self, gated: Gated, arguments: dict[str, Any], request: FastRequest) -> bool:
        """Whether the caller passes the gate Strawberry's view would put it through."""
        try:
            check_role(
                gated.role,
                gated.field,
                request.principal,
                arguments,
                max_page_size=self.settings.max_page_size,
            )
        except InventoryError:
            return False
        return True

    async def _run(
        self, gated: Gated, variables: dict[str, Any] | None, request: FastRequest
    ) -> Outcome:
        """A compiled route's outcome: its arguments, the gate, then the route itself."""
        arguments = gated.route.arguments(variables)
        if isinstance(arguments, Declined):
            return arguments
        if not self._gate(gated, arguments, request):
            return Declined("refused")
        return await gated.route.run(arguments, request)

    async def _answer(
        self, plan: Plan, variables: dict[str, Any] | None, request: FastRequest
    ) -> bytes:
        route = GRAPHQL_CORE
        try:
            if plan.first is not None:
                route = plan.first.name
                outcome = await self._run(plan.first, variables, request)
                _count(route, outcome)
                if isinstance(outcome, Answered):
                    return outcome.body
                route = GRAPHQL_CORE
                # A write the route made is answered from, never made again (hand_over.py).
                handed_over = outcome.handed_over
            else:
                handed_over = None
            answered = await plan.direct.run(variables, request.context(), handed_over)
            _count(route, answered)
            return answered.body
        except Exception as error:
            request_id = request.context().request_id
            expected = expected_outcome(error)
            if expected is not None:
                # The database's expected outcome (unavailable, a statement timed
                # out) met by a route's own read after its write (a beat's pins):
                # answered as masking.py answers it, not as a bug.
                log_expected_outcome(expected, route, error)
                _count(route, Declined(expected.code.lower()))
                return encode(
                    {
                        "data": None,
                        "errors": [
                            {
                                "message": expected.message,
                                "extensions": {**expected.extensions, "requestId": request_id},
                            }
                        ],
                    }
                )
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
