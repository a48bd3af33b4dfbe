"""A request's document checked before anything runs: parsed, validated, one operation chosen, its values held to the rules.

One home for both routes. Strawberry's view goes through the
DocumentChecks extension below (in place of Strawberry's ParserCache and
ValidationCache); the fast path's documents.py asks the same cache, so a
document one route checked is not checked again by the other.

- Cached per query text (least recently used out, texts longer than
  MAX_CACHED_LENGTH not kept): agents and schedulers send the same few
  documents thousands of times a second, and a parse and validation whose
  answer never changes is paid once.
- Bounds first: the document's depth, aliases and fields once spread
  (document_cost.py, each fragment measured once, linear in the text) are
  checked alone before graphql-core's rules, which then never walk a
  document past them.
- Off the event loop: a text not in the cache and longer than
  INLINE_CHARACTERS is parsed and validated in one worker thread, one
  document at a time. Every caller of the process waits while the loop is
  held, and a check is not short work at its worst: the lexer reads a
  string literal a character at a time in Python, and graphql-core compares
  the fields of one response name pairwise, so a megabyte of string or a
  few hundred `id`s in one selection held the loop long enough to be felt
  (BENCHMARKS.md has the figures). With the work in one other thread, the
  loop takes the interpreter back within a switch interval (5 ms) each time
  it needs it and answers the others meanwhile. A short text is checked on
  the loop: its worst is small, and it never queues behind long ones. A
  text is checked once, so either cost is paid once per document.
  docs/security/limits.md states the bound.
- One operation: a document of several operations and no operationName is
  refused, as the GraphQL specification requires (issue 44: Strawberry ran
  the first one, `mutation A {...} mutation B {...}` cordoned a node).
- Its values: String and ID variables must be text that can be stored, and
  lists no longer than their bounds, checked on the raw values before
  graphql-core coerces them (input_values.py); literals are checked by
  validation, cached with it.

A refusal before execution is answered as Strawberry answers a validation
error (a PreExecutionError: nothing runs), also on streaming transports
(websockets), where an exception from a parsing hook would end the
operation with a traceback instead of an answer: the document is then
replaced by an inert stand-in of an operation type the request may run, so
Strawberry's own operation-type check passes and its answer is the errors.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from weakref import WeakKeyDictionary

from graphql import (
    ASTValidationRule,
    DocumentNode,
    FieldNode,
    GraphQLError,
    GraphQLSchema,
    GraphQLSyntaxError,
    NameNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    parse,
    validate,
)
from strawberry.extensions import SchemaExtension

from .document_cost import FIRST_RULES
from .input_values import InputCheck, compile_input_check, located_surrogate
from .private_api import core_schema, provided_operation_name, validate_document
from .request_errors import BAD_REQUEST

T = TypeVar("T")

# Texts up to this long are checked on the event loop (the worst such
# document is a few milliseconds of work: BENCHMARKS.md), longer ones in the
# worker thread.
INLINE_CHARACTERS: Final = 256
# Longer texts are not kept: a client sending endless distinct large
# documents costs their check, never memory.
MAX_CACHED_LENGTH: Final = 16_384
MAX_ENTRIES: Final = 512

MULTIPLE_OPERATIONS: Final = "Must provide operation name if query contains multiple operations."


@dataclass
class Checked:
    """A query text's document (None: it did not parse) and the errors that refuse it."""

    document: DocumentNode | None
    errors: list[GraphQLError]
    operations: dict[str | None, OperationDefinitionNode] = field(default_factory=dict)
    # Per operation name, its variables' check (input_values.InputCheck; None:
    # no variable can hold a text or a list), made on first use.
    input_checks: dict[str | None, InputCheck | None] = field(default_factory=dict)

    def operation(self, name: str | None) -> OperationDefinitionNode | None:
        """The operation a request names, as GraphQL picks it; None when that is an error."""
        if name is None:
            if len(self.operations) != 1:
                return None
            return next(iter(self.operations.values()))
        return self.operations.get(name)

    def input_check(self, schema: GraphQLSchema, name: str | None) -> InputCheck | None:
        if name not in self.input_checks:
            operation = self.operation(name)
            self.input_checks[name] = (
                None
                if operation is None or self.document is None
                else compile_input_check(schema, self.document, operation)
            )
        return self.input_checks[name]


def check_text(
    schema: GraphQLSchema,
    query: str,
    rules: tuple[type[ASTValidationRule], ...],
    max_tokens: int | None,
) -> Checked:
    """Parse and validate one query text (the same rules, in the same order, on both routes)."""
    try:
        document = parse(query, max_tokens=max_tokens)
    except GraphQLSyntaxError as error:
        return Checked(None, [located_surrogate(error, max_tokens) or error])
    # The document's bounds first, alone: a document past them is refused
    # before graphql-core's rules walk it (OverlappingFieldsCanBeMergedRule
    # compares the fields of one response name pairwise).
    first = tuple(rule for rule in rules if rule in FIRST_RULES)
    errors = validate(schema, document, first) if first else []
    if not errors:
        errors = validate_document(schema, document, tuple(r for r in rules if r not in first))
    operations: dict[str | None, OperationDefinitionNode] = {}
    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            operations[definition.name.value if definition.name else None] = definition
    return Checked(document, errors, operations)


_worker: ThreadPoolExecutor | None = None


async def off_the_loop(query: str, work: Callable[[], T]) -> T:
    """`work` (a check of `query`), in the worker thread when the text is long (see the module).

    One thread, one document at a time: the event loop then competes for
    the interpreter with that one thread only, so it waits at most one
    switch interval each time it takes the interpreter back.
    """
    global _worker
    if len(query) <= INLINE_CHARACTERS:
        return work()
    if _worker is None:
        _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="document-checks")
    return await asyncio.get_running_loop().run_in_executor(_worker, work)


class CheckedDocuments:
    """Query text -> Checked, per set of rules and token limit (one per schema)."""

    def __init__(self, schema: GraphQLSchema, max_entries: int = MAX_ENTRIES) -> None:
        self.schema = schema
        self._max_entries = max_entries
        self._entries: OrderedDict[
            tuple[str, tuple[type[ASTValidationRule], ...], int | None], Checked
        ] = OrderedDict()

    async def check(
        self,
        query: str,
        rules: tuple[type[ASTValidationRule], ...],
        max_tokens: int | None,
    ) -> Checked:
        key = (query, rules, max_tokens)
        checked = self._entries.get(key)
        if checked is not None:
            self._entries.move_to_end(key)
            return checked
        checked = await off_the_loop(
            query, lambda: check_text(self.schema, query, rules, max_tokens)
        )
        if len(query) <= MAX_CACHED_LENGTH:
            self._entries[key] = checked
            if len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return checked

    def __len__(self) -> int:
        return len(self._entries)


_documents: WeakKeyDictionary[GraphQLSchema, CheckedDocuments] = WeakKeyDictionary()


def checked_documents(schema: GraphQLSchema) -> CheckedDocuments:
    """The schema's cache of checked documents, shared by both routes."""
    found = _documents.get(schema)
    if found is None:
        found = _documents[schema] = CheckedDocuments(schema)
    return found


def operation_refusal(checked: Checked, operation_name: str | None) -> GraphQLError | None:
    """GraphQL's error for a request that names no operation of a document of several."""
    if operation_name is None and len(checked.operations) > 1:
        return GraphQLError(MULTIPLE_OPERATIONS, extensions={"code": BAD_REQUEST})
    return None


# The stand-in document, per operation type and name (see the module).
_STAND_INS: dict[tuple[OperationType, str | None], DocumentNode] = {}


def stand_in(allowed: Sequence[OperationType] | Any, name: str | None) -> DocumentNode:
    """A document of one operation of a type the request may run, named as it asked, that runs nothing."""
    kind = next(
        (k for k in (OperationType.QUERY, OperationType.MUTATION, OperationType.SUBSCRIPTION)
         if k in allowed),
        OperationType.QUERY,
    )  # fmt: skip
    key = (kind, name)
    document = _STAND_INS.get(key)
    if document is None:
        operation = OperationDefinitionNode(
            operation=kind,
            name=None if name is None else NameNode(value=name),
            variable_definitions=(),
            directives=(),
            selection_set=SelectionSetNode(
                selections=(
                    FieldNode(name=NameNode(value="__typename"), arguments=(), directives=()),
                )
            ),
        )
        document = _STAND_INS[key] = DocumentNode(definitions=(operation,))
    return document


class DocumentChecks(SchemaExtension):
    """Strawberry's route: the module's checks, in place of ParserCache and ValidationCache."""

    _checked: Checked | None = None

    async def on_parse(self) -> AsyncIterator[None]:
        context = self.execution_context
        if context.graphql_document is None and context.query:
            checked = await checked_documents(core_schema(context.schema)).check(
                context.query, context.validation_rules, context.parse_options.get("max_tokens")
            )
            name = provided_operation_name(context)
            refused = list(checked.errors) if checked.document is None else None
            if refused is None:
                ambiguous = operation_refusal(checked, name)
                refused = None if ambiguous is None else [ambiguous]
            if refused is not None:
                context.pre_execution_errors = refused
                context.graphql_document = stand_in(context.allowed_operations, name)
            else:
                self._checked = checked
                context.graphql_document = checked.document
        yield

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        checked = self._checked
        if checked is not None and context.pre_execution_errors is None:
            # A new list each time: Strawberry's callers may add to it.
            errors = list(checked.errors)
            if not errors:
                check = checked.input_check(
                    core_schema(context.schema), provided_operation_name(context)
                )
                refused = None if check is None else check.refusal(context.variables)
                if refused is not None:
                    errors.append(refused)
            context.pre_execution_errors = errors
        yield
