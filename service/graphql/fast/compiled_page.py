"""Pages of nodes, compiled: PostgreSQL builds the answer's JSON (service/graphql/fast/json_pages.py).

Why: a full 1,000-node page (`nodes { gpus storage allocations }`) is tens
of thousands of values, and executing it field by field costs the service
far more CPU than PostgreSQL spends building the same JSON itself.

Which documents: a query with one root field, `nodes` (filter, first, after)
or `freeGpus` (the schedulers' question: gpuClass, fabric, minFree, first,
after), its arguments variables or literals, selecting what
json_pages can express. For freeGpus: gpuIndices and its node. For a node:
leaves (IDs, strings, integers, booleans, Bytes, DateTime, the enums of
stored columns, _STORED_VALUES), lists of leaves, localDisk/sharedDisk, labels and engineVersions
(node_reads.by_key's order), nvlinkGroups and largestFreeNvlinkGroup
(service/fleet/topology.py's definitions), and the detail
lists gpus (with allocation, taints and recommendedAction), freeGpus without gpuClass
(service/scheduling/availability.py's gpu_free), storage, allocations, fabrics,
weights, and fleet health's taints, drift and remediations (service/fleet/health/'s
SQL for them) with their leaves. Aliases and __typename too; no directives,
fragments or repeated response keys. Everything else (a field given
arguments, hasWeights or hcasFor) runs through graphql-core as before.
The same selections of one node by id: compiled_node.py.

How it stays exact: the gate (front_door.py: the role and page size, as
for the resolver), the resolver's argument mapping (operations/queries.py), the same
page rule (service/paging.py: a page without `first` that stopped short answers
PAGE_TRUNCATED at the field, where graphql-core would place it),
the page node_reads.list_nodes reads, the loaders' orders, and per leaf the
value the record holds (tests/fast_path/test_compiled_page.py compares both ways field
by field). Which record attribute answers which field is read from the
Strawberry types (fields.py). A filter is an input object: its value is
computed by the very functions the executor and the resolver use
(graphql-core's variable and argument coercion, Strawberry's conversion to
the NodeFilter class), so no rule of theirs is restated here. Whatever
graphql-core would have to decide (a variable of another type, a refused
caller, a page size out of range, a database that is down or a text it
cannot store) is declined with a reason, and graphql-core runs the document
as usual: a read, so running it again writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

import strawberry
from graphql import (
    GRAPHQL_MAX_INT,
    GRAPHQL_MIN_INT,
    FieldNode,
    GraphQLEnumType,
    GraphQLError,
    GraphQLField,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    IntValueNode,
    NamedTypeNode,
    NonNullTypeNode,
    NullValueNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    StringValueNode,
    ValueNode,
    VariableNode,
    get_argument_values,
    get_named_type,
    get_variable_values,
    located_error,
)

from service import node_states
from service.database.connections import NativeConnection
from service.fleet.health import policy, remediations
from service.graphql.operations.queries import free_gpus_arguments, nodes_arguments
from service.graphql.private_api import core_schema
from service.paging import PageRequest
from service.scheduling import taints, weights_lifecycle

from . import json_pages
from .documents import only_root_field
from .fast_request import FastRequest
from .fields import ArgumentConversion, NotAnObjectType, record_attributes
from .outcomes import Answered, Declined, Outcome, compiled_read

# The root fields compiled, and the arguments CompiledPage.run passes on, by
# their types: an argument the page does not pass on is declined, never
# dropped (a new argument of `nodes` goes through graphql-core until the page
# knows it).
ROOTS: Mapping[str, Mapping[str, str]] = {
    "nodes": {"filter": "NodeFilter", "first": "Int", "after": "ID"},
    "freeGpus": {"gpuClass": "String", "fabric": "String", "minFree": "Int", "first": "Int",
                 "after": "ID"},
}  # fmt: skip

# Each argument's Python name: the resolver's keyword, which the gate and
# operations/queries.py's argument mappings read.
_PYTHON_NAMES: Mapping[str, str] = {
    "filter": "filter_", "first": "first", "after": "after", "gpuClass": "gpu_class",
    "fabric": "fabric", "minFree": "min_free",
}  # fmt: skip

# Leaves whose JSON PostgreSQL writes as the type's output coercion would: a
# text, a 32-bit integer column (always within Int), a bigint (Bytes is a JSON
# integer), a boolean, a timestamp as the DateTime scalar writes it
# (json_pages.timestamp). Any other scalar (JSON...) is graphql-core's.
_LEAVES = frozenset({"ID", "String", "Int", "Boolean", "Bytes", "DateTime"})

# The enums a page writes from a stored column, with every value that column
# can hold: a node's state and a weights row's; a taint's effect and source,
# a drift finding's kind, a remediation's action and state (the columns'
# CHECKs and their writers hold them to the domain's enums); and
# Gpu.recommendedAction, which the policy writes (json_pages.recommend).
_STORED_VALUES: Mapping[str, Collection[str]] = {
    "NodeState": node_states.STATES,
    "WeightsState": weights_lifecycle.STATES.keys(),
    "TaintEffect": [e.value for e in taints.TaintEffect],
    "TaintSource": [s.value for s in taints.TaintSource],
    "DriftKind": [k.value for k in policy.DriftKind],
    "RemediationAction": [a.value for a in policy.RemediationAction],
    "RemediationState": [s.value for s in remediations.RemediationState],
}

_NOT_GIVEN: Any = object()


class _Declined(Exception):
    """The document is not one this module compiles."""


class _ResolverArguments:
    """A root field's arguments as its resolver receives them, computed as the executor would.

    For arguments that are input objects (a nodes filter), where restating
    graphql-core's coercion rules here would be a second copy of them:
    graphql-core coerces the variables and the field's arguments, Strawberry
    converts them into its input classes. A value graphql-core refuses
    raises, and the caller lets graphql-core answer with its own error.
    """

    def __init__(
        self,
        schema: strawberry.Schema,
        operation: OperationDefinitionNode,
        field: GraphQLField,
        node: FieldNode,
        convert: ArgumentConversion,
    ) -> None:
        self._core = core_schema(schema)
        self._definitions = operation.variable_definitions or ()
        self._field = field
        self._node = node
        self._convert = convert

    def __call__(self, variables: dict[str, Any]) -> dict[str, Any]:
        values = get_variable_values(self._core, self._definitions, variables)
        if isinstance(values, list):  # errors: graphql-core's to word
            raise _Declined
        try:
            given = get_argument_values(self._field, self._node, values)
        except GraphQLError:  # graphql-core's to word
            raise _Declined from None
        return self._convert(given)


class CompiledPage:
    def __init__(
        self,
        field: str,
        root: FieldNode,
        key: str,
        page: json_pages.NodePage | json_pages.FreeGpusPage,
        arguments: Mapping[str, tuple[str | None, Any, bool]],
        resolver_arguments: _ResolverArguments | None = None,
    ) -> None:
        self._field = field
        self._root = root
        self._response_key = key
        self._key = json.dumps(key).encode()
        self._page = page
        # argument -> (variable name or None, literal value, variable is non-null)
        self._arguments = arguments
        # Set when an argument is an input object (a filter): every argument
        # is then computed the executor's way.
        self._resolver_arguments = resolver_arguments
        self._types = ROOTS[field]

    def _argument(self, name: str, variables: Mapping[str, Any]) -> Any:
        """The argument's value as the resolver would get it, or raise _Declined."""
        if name not in self._arguments:
            return None
        variable, literal, non_null = self._arguments[name]
        if variable is None:
            return literal
        value = variables.get(variable, _NOT_GIVEN)
        if value is _NOT_GIVEN or value is None:
            # A missing non-null variable is graphql-core's error to word.
            if non_null:
                raise _Declined
            return None
        if self._types[name] == "Int":
            if type(value) is not int or not GRAPHQL_MIN_INT <= value <= GRAPHQL_MAX_INT:
                raise _Declined
        elif type(value) is not str:  # an ID may also be sent as an integer
            raise _Declined
        return value

    def arguments(self, variables: dict[str, Any] | None) -> dict[str, Any] | Declined:
        try:
            if self._resolver_arguments is not None:
                return self._resolver_arguments(variables or {})
            return {
                _PYTHON_NAMES[name]: self._argument(name, variables or {}) for name in self._types
            }
        except _Declined:
            return Declined("arguments_for_graphql_core")

    async def run(self, arguments: dict[str, Any], request: FastRequest) -> Outcome:
        async def read() -> json_pages.JsonPage:
            page = request.page_request(arguments.get("first"))
            # Where the request's reads go: a replica when it tolerates staleness.
            return await request.read(lambda conn: self._fetch(conn, arguments, page))

        answer = await compiled_read(read)
        if isinstance(answer, Declined):
            return answer
        body = b'{"data":{' + self._key + b":" + answer.entries.encode() + b"}"
        if answer.truncated is not None:
            # Where and how graphql-core places it (pages.py): at the field.
            truncated = located_error(answer.truncated, [self._root], [self._response_key])
            body += b',"errors":[' + json.dumps(truncated.formatted).encode() + b"]"
        return Answered(body + b"}")

    async def _fetch(
        self, conn: NativeConnection, given: Mapping[str, Any], request: PageRequest
    ) -> json_pages.JsonPage:
        if isinstance(self._page, json_pages.FreeGpusPage):
            free = free_gpus_arguments(
                given.get("gpu_class"),
                given.get("fabric"),
                given.get("min_free"),
                given.get("after"),
            )
            return await self._page.fetch(
                conn,
                gpu_class=free.gpu_class,
                fabric=free.fabric,
                min_free=free.min_free,
                request=request,
                after=free.after,
            )
        nodes = nodes_arguments(given.get("filter_"), given.get("after"))
        return await self._page.fetch(conn, nodes.node_filter, request, nodes.after)


def _literal(type_name: str, value: ValueNode) -> Any:
    if isinstance(value, NullValueNode):
        return None
    if type_name == "Int" and isinstance(value, IntValueNode):
        number = int(value.value)
        if GRAPHQL_MIN_INT <= number <= GRAPHQL_MAX_INT:
            return number
    if type_name != "Int" and isinstance(value, StringValueNode):
        return value.value
    raise _Declined


def _variable_types(operation: OperationDefinitionNode) -> dict[str, tuple[str, bool]]:
    """Each variable's named type and whether it is non-null (no defaults taken)."""
    out: dict[str, tuple[str, bool]] = {}
    for definition in operation.variable_definitions or ():
        if definition.default_value is not None or definition.directives:
            raise _Declined
        type_node = definition.type
        non_null = isinstance(type_node, NonNullTypeNode)
        if isinstance(type_node, NonNullTypeNode):
            type_node = type_node.type
        if not isinstance(type_node, NamedTypeNode):
            raise _Declined
        out[definition.variable.name.value] = (type_node.name.value, non_null)
    return out


class _Compiler:
    def __init__(self, schema: strawberry.Schema) -> None:
        self._schema = schema

    def record_attributes(self, type_name: str) -> dict[str, str]:
        try:
            return record_attributes(self._schema, type_name)
        except NotAnObjectType:
            raise _Declined from None

    def selection(
        self, parent: GraphQLObjectType, selection_set: SelectionSetNode | None
    ) -> tuple[json_pages.Value, ...]:
        if selection_set is None:
            raise _Declined
        names = self.record_attributes(parent.name)
        values: list[json_pages.Value] = []
        keys: set[str] = set()
        for selection in selection_set.selections:
            if not isinstance(selection, FieldNode) or selection.directives or selection.arguments:
                raise _Declined
            name = selection.name.value
            key = selection.alias.value if selection.alias else name
            if key in keys:  # graphql-core merges repeated keys; json_build_object would not
                raise _Declined
            keys.add(key)
            if name == "__typename":
                values.append(json_pages.Value(key, constant=parent.name))
                continue
            field = parent.fields.get(name)
            attribute = names.get(name)
            if field is None or attribute is None:
                raise _Declined
            values.append(self.value(key, attribute, field.type, selection))
        return tuple(values)

    def value(self, key: str, attribute: str, type_: Any, node: FieldNode) -> json_pages.Value:
        named = get_named_type(type_)
        if isinstance(named, GraphQLObjectType):
            return json_pages.Value(
                key, attribute, selection=self.selection(named, node.selection_set)
            )
        if isinstance(named, GraphQLEnumType):
            if _is_list(type_):
                raise _Declined
            names = {_enum_value(v.value): n for n, v in named.values.items()}
            # Every value the database can hold must have its name.
            stored = _STORED_VALUES.get(named.name)
            if stored is None or not set(stored) <= set(names):
                raise _Declined
            return json_pages.Value(key, attribute, names=names)
        if named.name not in _LEAVES:
            raise _Declined
        return json_pages.Value(key, attribute)


def compile_selection(
    schema: strawberry.Schema, parent: GraphQLObjectType, selection_set: SelectionSetNode | None
) -> tuple[json_pages.Value, ...] | None:
    """json_pages' values for a selection of `parent`, None when it cannot build all of it.

    Also the compiled node(id)'s selection (compiled_node.py): one rule of
    what PostgreSQL may build, for a page and for one node.
    """
    try:
        return _Compiler(schema).selection(parent, selection_set)
    except _Declined:
        return None


def _is_list(type_: Any) -> bool:
    while isinstance(type_, GraphQLNonNull):
        type_ = type_.of_type
    return isinstance(type_, GraphQLList)


def _enum_value(value: Any) -> Any:
    # Strawberry's enum values are the Python enum's members.
    return getattr(value, "value", value)


def compile_page(
    schema: strawberry.Schema, operation: OperationDefinitionNode
) -> CompiledPage | None:
    """A CompiledPage for an operation of the shape above, else None."""
    root = only_root_field(operation, OperationType.QUERY)
    if root is None:
        return None
    field = root.name.value
    root_type = core_schema(schema).query_type
    if field not in ROOTS or root_type is None:
        return None
    entry_type = get_named_type(root_type.fields[field].type)
    if not isinstance(entry_type, GraphQLObjectType):
        return None
    types = ROOTS[field]
    try:
        resolver_arguments = None
        if any(a.name.value == "filter" for a in root.arguments or ()):
            resolver_arguments = _ResolverArguments(
                schema,
                operation,
                root_type.fields[field],
                root,
                _strawberry_arguments(schema, field),
            )
        variable_types = _variable_types(operation) if resolver_arguments is None else {}
        arguments: dict[str, tuple[str | None, Any, bool]] = {}
        for argument in root.arguments or ():
            name = argument.name.value
            if name not in types:
                raise _Declined
            if resolver_arguments is not None:
                continue
            if isinstance(argument.value, VariableNode):
                variable = argument.value.name.value
                type_name, non_null = variable_types.pop(variable, ("", False))
                if type_name != types[name]:
                    raise _Declined
                arguments[name] = (variable, None, non_null)
            else:
                arguments[name] = (None, _literal(types[name], argument.value), False)
        if variable_types:  # a variable used twice, or not by these arguments
            raise _Declined
        values = _Compiler(schema).selection(entry_type, root.selection_set)
        page: json_pages.NodePage | json_pages.FreeGpusPage = (
            json_pages.FreeGpusPage(values) if field == "freeGpus" else json_pages.NodePage(values)
        )
    except (_Declined, json_pages.Unsupported):
        return None
    key = root.alias.value if root.alias else field
    return CompiledPage(field, root, key, page, arguments, resolver_arguments)


def _strawberry_arguments(schema: strawberry.Schema, field: str) -> ArgumentConversion:
    try:
        return ArgumentConversion(schema, "Query", field)
    except LookupError:
        raise _Declined from None
