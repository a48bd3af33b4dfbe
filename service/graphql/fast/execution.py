"""The execution context: plain fields completed without graphql-core's per-field machinery.

A 1,000-node page is about 50,000 fields, and graphql-core spends most of a
page's CPU on each of them alike: a Path, a ResolveInfo, Strawberry's default
resolver, then complete_value's chain of checks, for a field whose value is
just an attribute of a Strawberry object. Most fields are like that (see
types.py: every field without a resolver), so for each object type and its
collected selection we plan once which fields are *plain* and complete those
directly: getattr, then the GraphQL type's own output coercion, recursing into
lists and nested objects whose selection is plain too.

Exact semantics or delegation. The fast path has no side effects: it reads
attributes and coerces them, it records no error and builds no Path. So when it
meets anything it does not handle the way graphql-core would (None in a
non-null position, a value that is awaitable or an Exception, a coercion that
raises or answers null, an iterable that is not a list), it drops what it
computed for that field and hands the field to graphql-core's execute_field,
which produces the error, its message and its path exactly as it always did.
Fields with a resolver (every root field) take that path, so resolvers,
DataLoaders, awaitables, field extensions and masking are untouched.

One kind of resolver field is planned too: one listed in PREFETCHED, with
how to read its value when the root field has already prefetched it
(Node.gpus, Node.storage... of a page: loaders.prefetch_nodes). Each reader
is the resolver's own synchronous branch (the loader's cached value, as the
resolver returns it; tests/fast_path/test_plain_field_completion.py holds
each against its resolver), so the value is the same; when it answers
NOT_READY (nothing cached, or the load failed) the field goes to
graphql-core, which calls the resolver as it always did. Without it, a page
would pay three resolver calls per node through execute_field. The list is
this package's: the types know nothing of the fast path.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from graphql import (
    GRAPHQL_MAX_INT,
    GRAPHQL_MIN_INT,
    GraphQLBoolean,
    GraphQLError,
    GraphQLField,
    GraphQLID,
    GraphQLInt,
    GraphQLLeafType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLResolveInfo,
    GraphQLString,
    is_leaf_type,
    is_list_type,
    is_non_null_type,
    is_object_type,
)
from graphql.pyutils import AwaitableOrValue, Path, Undefined, gather_with_cancel
from strawberry.types.field import StrawberryField

from service.graphql.loaders import ready
from service.graphql.private_api import (
    FieldDetailsList,
    GroupedFieldSet,
    StrawberryGraphQLCoreExecutionContext,
    is_default_resolver,
)

from . import switch

# Completes one value of a planned output type, or raises: any exception means
# "not the fast path's to answer", never an answer of its own.
Completer = Callable[[Any], Any]

# Reads a field's raw value from its parent object, or raises (Delegate) for
# graphql-core to resolve the field itself.
Getter = Callable[[Any], Any]

# One response key of a selection: its field details (for graphql-core when the
# field is delegated), how its value is read (None for __typename, whose value
# is the parent type's name), and its completer (None: always graphql-core's).
Entry = tuple[str, FieldDetailsList, Getter | None, Completer | None]

# Types graphql-core's awaitable check and Exception check can never be true
# of: skipping both for them is most of what makes a leaf cheap.
_SIMPLE_TYPES = frozenset({str, int, float, bool})

# Directives that have done their work by the time fields are collected. Any
# other (@defer, @stream, a custom one) sends the field through graphql-core,
# which knows what it means.
_COLLECTION_DIRECTIVES = frozenset({"include", "skip"})

STRAWBERRY_DEFINITION = "strawberry-definition"

# What a PREFETCHED reader answers when the value is not at hand.
NOT_READY: Any = object()

# Reads a resolver field's value from its parent object and the request's
# context when the root field prefetched it, else NOT_READY.
Reader = Callable[[Any, Any], Any]


def _as_loaded(value: Any) -> Any:
    return value


def _loaded(loader: str) -> Reader:
    """The value `loader` (an attribute of the request's Loaders) holds for the node, as is."""
    loader_of = attrgetter(loader)

    def read(node: Any, context: Any) -> Any:
        value = ready(loader_of(context.loaders), str(node.id), _as_loaded)
        return NOT_READY if value is None else value

    return read


# (type, GraphQL field) -> how to read the field's value at once when it was
# prefetched: Node's detail lists without arguments, each the loader its
# resolver reads (types.py: now_or_later(loader, id, as loaded)).
PREFETCHED: dict[tuple[str, str], Reader] = {
    ("Node", "gpus"): _loaded("gpus"),
    ("Node", "fabrics"): _loaded("fabrics"),
    ("Node", "storage"): _loaded("filesystems"),
    ("Node", "weights"): _loaded("weights"),
    ("Node", "allocations"): _loaded("shards_on_node"),
}


class Delegate(Exception):
    """The fast path declines a value; graphql-core completes the field instead."""


# What reading or coercing a value raises when graphql-core would answer the
# field with an error of its own (a scalar refusing a value, a missing
# attribute): the field is handed to graphql-core, which words the error. Any
# other exception is a bug of this module and propagates (no quiet fallback).
DELEGATED: tuple[type[Exception], ...] = (
    Delegate,
    GraphQLError,
    TypeError,
    ValueError,
    AttributeError,
)


class Plan:
    """The response keys of one selection on one object type, in response order."""

    __slots__ = ("entries", "fast", "grouped_field_set")

    def __init__(self, grouped_field_set: GroupedFieldSet, entries: list[Entry]) -> None:
        # Held so its id, the plan's key, cannot be reused during the request.
        self.grouped_field_set = grouped_field_set
        self.entries = entries
        self.fast = all(entry[3] is not None for entry in entries)


class PlainFieldExecutionContext(StrawberryGraphQLCoreExecutionContext):
    """Strawberry's execution context (it builds Strawberry's Info), with plain fields planned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per request, like graphql-core's own memo of collected subfields that
        # the plans are keyed on (a grouped field set is built anew for each
        # request, and depends on its variables through @include/@skip).
        # Planning costs a few microseconds per field of the query, not of the
        # answer, so a cache across requests would save nothing worth its
        # lifetime bookkeeping.
        self._plans: dict[tuple[GraphQLObjectType, int], Plan] = {}
        # Completers of resolvers' values, by return type and field details
        # (held in the value so their id cannot be reused during the request).
        self._value_completers: dict[
            tuple[GraphQLOutputType, int], tuple[FieldDetailsList, Completer | None]
        ] = {}
        # A middleware (a Strawberry extension with a `resolve` hook) must see
        # every field, plain or not: with one, everything takes the stock path,
        # as it does with the fast path switched off (switch.py).
        manager = self.middleware_manager
        self._fast_path = switch.enabled(self.context_value) and not (
            manager is not None and manager.middlewares
        )

    def execute_fields(
        self,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Path | None,
        grouped_field_set: GroupedFieldSet,
        position_context: Any,
    ) -> AwaitableOrValue[dict[str, Any]]:
        # A position context means @defer is in play: graphql-core's own plan of
        # delivery groups decides what runs where, so it runs everything.
        if position_context is not None or not self._fast_path:
            return super().execute_fields(
                parent_type, source_value, path, grouped_field_set, position_context
            )
        plan = self._plan(parent_type, grouped_field_set)
        if plan.fast:
            try:
                return _complete_fields(plan.entries, parent_type.name, source_value)
            except DELEGATED:  # the per-field loop below finds which field and delegates it
                pass
        return self._execute_planned(parent_type, source_value, path, plan)

    def complete_value(
        self,
        return_type: GraphQLOutputType,
        field_details_list: FieldDetailsList,
        info: GraphQLResolveInfo[Any],
        path: Path,
        result: Any,
        position_context: Any,
    ) -> AwaitableOrValue[Any]:
        # What a resolver returned (Node.gpus: a list of plain Gpu objects) is
        # completed like a plain field's value when its selection is plain:
        # with plain fields alone planned, graphql-core's chain per list item
        # (complete_list_item_value, complete_object_value, collect_subfields,
        # execute_fields) was most of what was left of a page's completion.
        # The resolver itself has already run in graphql-core's execute_field,
        # and a value the fast path declines is completed by graphql-core from
        # the start, so the fast path never leaves a half-made answer behind.
        if position_context is None and self._fast_path:
            key = (return_type, id(field_details_list))
            cached = self._value_completers.get(key)
            if cached is None:
                complete = (
                    self._completer(return_type, field_details_list)
                    if _only_collection_directives(field_details_list)
                    else None
                )
                cached = self._value_completers[key] = (field_details_list, complete)
            complete = cached[1]
            if complete is not None:
                try:
                    return complete(result)
                except DELEGATED:  # graphql-core reproduces the error below
                    pass
        return super().complete_value(
            return_type, field_details_list, info, path, result, position_context
        )

    def _execute_planned(
        self, parent_type: GraphQLObjectType, source: Any, path: Path | None, plan: Plan
    ) -> AwaitableOrValue[dict[str, Any]]:
        """graphql-core's execute_fields, with plain fields answered in place."""
        results: dict[str, Any] = {}
        is_awaitable = self.is_awaitable
        awaitable_fields: list[str] = []
        typename = parent_type.name
        try:
            for response_name, field_details_list, read, complete in plan.entries:
                if complete is not None:
                    try:
                        results[response_name] = (
                            typename if read is None else complete(read(source))
                        )
                        continue
                    except DELEGATED:  # graphql-core reproduces the error below
                        pass
                field_path = Path(path, response_name, typename)
                result = self.execute_field(
                    parent_type, source, field_details_list, field_path, None
                )
                if result is not Undefined:
                    results[response_name] = result
                    if is_awaitable(result):
                        awaitable_fields.append(response_name)
        except Exception:
            if awaitable_fields:
                # As graphql-core does: the other fields' awaitables may fail too.
                self.settle_in_background([results[field] for field in awaitable_fields])
            raise

        if not awaitable_fields:
            return results

        async def get_results() -> dict[str, Any]:
            if len(awaitable_fields) == 1:
                field = awaitable_fields[0]
                results[field] = await results[field]
            else:
                awaited = await gather_with_cancel(*(results[field] for field in awaitable_fields))
                results.update(zip(awaitable_fields, awaited, strict=True))
            return results

        return get_results()

    # Planning.

    def _plan(self, parent_type: GraphQLObjectType, grouped_field_set: GroupedFieldSet) -> Plan:
        key = (parent_type, id(grouped_field_set))
        plan = self._plans.get(key)
        if plan is None:
            entries = [
                (name, details, *self._plan_field(parent_type, details))
                for name, details in grouped_field_set.items()
            ]
            plan = self._plans[key] = Plan(grouped_field_set, entries)
        return plan

    def _plan_field(
        self, parent_type: GraphQLObjectType, field_details_list: FieldDetailsList
    ) -> tuple[Getter | None, Completer | None]:
        """How a field's value is read and its completer, or (None, None) for graphql-core."""
        first = field_details_list[0].node
        field_name = first.name.value
        if not _only_collection_directives(field_details_list):
            return None, None
        if field_name == "__typename":
            # Its value is the parent type's name: a str, which String returns as is.
            return None, _identity
        field = self.schema.get_field(parent_type, field_name)
        if field is None or first.arguments:
            return None, None
        read = self._plain_getter(parent_type, field_name, field)
        if read is None:
            return None, None
        complete = self._completer(field.type, field_details_list)
        return (read, complete) if complete is not None else (None, None)

    def _plain_getter(
        self, parent_type: GraphQLObjectType, field_name: str, field: GraphQLField
    ) -> Getter | None:
        attribute = plain_attribute(field)
        if attribute is not None:
            return attrgetter(attribute)
        prefetched = _prefetched_reader(parent_type.name, field_name, field)
        if prefetched is None:
            return None
        context = self.context_value

        def read(source: Any) -> Any:
            value = prefetched(source, context)
            if value is NOT_READY:
                raise Delegate
            return value

        return read

    def _completer(
        self, return_type: GraphQLOutputType, field_details_list: FieldDetailsList
    ) -> Completer | None:
        """How to complete a value of this type as graphql-core's complete_value would, if plain."""

        def entries(object_type: GraphQLObjectType) -> list[Entry] | None:
            sub_fields, new_defer_usages, _forbidden = self.collect_subfields(
                object_type, field_details_list
            )
            if new_defer_usages:
                return None
            plan = self._plan(object_type, sub_fields)
            # Not fast: a resolver inside. The field goes through graphql-core,
            # whose completion of the object comes back to execute_fields above.
            return plan.entries if plan.fast else None

        return plain_completer(return_type, entries, self.is_awaitable)


def plain_completer(
    return_type: GraphQLOutputType,
    object_entries: Callable[[GraphQLObjectType], list[Entry] | None],
    is_awaitable: Callable[[Any], bool],
    non_null: bool = False,
) -> Completer | None:
    """How to complete a value of this type as graphql-core's complete_value would, if plain.

    `object_entries` plans an object type's selection (None: not plain).
    Also the compiled place route's (compiled_place.py), whose selections are
    collected without an execution context. Non-null is a flag of the
    completer it wraps rather than a completer of its own: a call per value
    was the fast path's biggest cost.
    """
    if is_non_null_type(return_type):
        assert isinstance(return_type, GraphQLNonNull)
        return plain_completer(return_type.of_type, object_entries, is_awaitable, non_null=True)
    if is_list_type(return_type):
        assert isinstance(return_type, GraphQLList)
        item = plain_completer(return_type.of_type, object_entries, is_awaitable)
        return None if item is None else _list(item, non_null)
    if is_leaf_type(return_type):
        return _leaf(return_type, is_awaitable, non_null)
    if is_object_type(return_type):
        assert isinstance(return_type, GraphQLObjectType)
        # is_type_of needs a ResolveInfo (Strawberry sets it for types with
        # interfaces); abstract types need a type resolver: graphql-core's.
        if return_type.is_type_of is not None:
            return None
        entries = object_entries(return_type)
        if entries is None:
            return None
        return object_completer(entries, return_type.name, is_awaitable, non_null)
    return None


def _only_collection_directives(field_details_list: FieldDetailsList) -> bool:
    return all(
        directive.name.value in _COLLECTION_DIRECTIVES
        for details in field_details_list
        for directive in details.node.directives or ()
    )


def plain_attribute(field: GraphQLField) -> str | None:
    """The attribute a field's value is, when its resolver is Strawberry's default getattr."""
    definition = (field.extensions or {}).get(STRAWBERRY_DEFINITION)
    if not isinstance(definition, StrawberryField):
        return None
    # Strawberry marks the resolver it makes for a field without a resolver
    # with _is_default; that resolver is a bare getattr unless the field has
    # extensions (a permission check, say), hence the checks on the field. A
    # schema's exception handlers may wrap it too, but they act only on an
    # exception or an awaitable, both of which the fast path hands back.
    if not is_default_resolver(field.resolve):
        return None
    if definition.base_resolver is not None or definition.extensions:
        return None
    if definition.default_resolver is not getattr or field.args:
        return None
    return definition.python_name


def _prefetched_reader(type_name: str, field_name: str, field: GraphQLField) -> Reader | None:
    """The PREFETCHED reader of a resolver field without arguments or extensions, if it has one."""
    definition = (field.extensions or {}).get(STRAWBERRY_DEFINITION)
    if not isinstance(definition, StrawberryField) or definition.extensions or field.args:
        return None
    return PREFETCHED.get((type_name, field_name))


# Completers. Each takes the field's raw value and returns what graphql-core's
# complete_value would, or raises for graphql-core to handle the field. Every
# value graphql-core would treat specially is declined rather than imitated:
# an awaitable (execute_field and complete_iterable_value await it), an
# Exception (complete_value raises it), Undefined (complete_value reads it as
# null, where String's coercion would write "Undefined").


def _identity(value: Any) -> Any:
    return value


def _unusual(value: Any, is_awaitable: Callable[[Any], bool]) -> bool:
    """A value graphql-core would await, raise, or read as null (its Undefined), not complete."""
    return value is Undefined or isinstance(value, Exception) or is_awaitable(value)


def _list(item: Completer, non_null: bool) -> Completer:
    def complete(value: Any) -> Any:
        if value is None:
            if non_null:
                raise Delegate  # "Cannot return null for non-nullable field": graphql-core's words
            return None
        # graphql-core takes any iterable (and async iterables); a list or a
        # tuple is what Strawberry objects hold, the rest it handles itself.
        # Neither is awaitable nor an Exception.
        if type(value) is not list and type(value) is not tuple:
            raise Delegate
        return [item(v) for v in value]

    return complete


def _leaf(
    leaf_type: GraphQLLeafType, is_awaitable: Callable[[Any], bool], non_null: bool
) -> Completer:
    coerce = leaf_type.coerce_output_value

    def complete(value: Any) -> Any:
        if value is None:
            if non_null:
                raise Delegate
            return None
        if type(value) not in _SIMPLE_TYPES and _unusual(value, is_awaitable):
            raise Delegate
        coerced = coerce(value)
        if coerced is None or coerced is Undefined:
            raise Delegate  # graphql-core's TypeError names the coercion's answer
        return coerced

    # graphql-core's String and ID return a str as it is, Boolean a bool and
    # Int an int in 32-bit range: those are answered without the call, the
    # rest (None included) by the general completion above.
    if leaf_type is GraphQLInt:

        def complete_int(value: Any) -> Any:
            if type(value) is int and GRAPHQL_MIN_INT <= value <= GRAPHQL_MAX_INT:
                return value
            return complete(value)

        return complete_int
    passes = (
        str
        if leaf_type is GraphQLString or leaf_type is GraphQLID
        else bool
        if leaf_type is GraphQLBoolean
        else None
    )
    if passes is None:
        return complete

    def complete_passing(value: Any) -> Any:
        if type(value) is passes:
            return value
        return complete(value)

    return complete_passing


def object_completer(
    entries: list[Entry], typename: str, is_awaitable: Callable[[Any], bool], non_null: bool
) -> Completer:
    def complete(value: Any) -> Any:
        if value is None:
            if non_null:
                raise Delegate
            return None
        if _unusual(value, is_awaitable):
            raise Delegate
        return _complete_fields(entries, typename, value)

    return complete


def _complete_fields(entries: list[Entry], typename: str, source: Any) -> dict[str, Any]:
    """A selection whose every field is plain, completed at once."""
    return {
        response_name: typename if read is None else complete(read(source))  # type: ignore[misc]
        for response_name, _details, read, complete in entries
    }
