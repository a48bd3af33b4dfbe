"""What a document asks of the service, measured before anything runs: depth, aliases, fields.

Issue 44: Strawberry's QueryDepthLimiter and MaxAliasesLimiter walked every
fragment spread again each time they met it. Twenty-one fragments, each
spreading the next one twice (876 bytes), were 2^21 walks on the event loop,
and no caller was answered meanwhile. Here every selection set, a fragment's
included, is measured once and its measure reused wherever it is spread, so
checking a document costs one pass over its text however large its
expansion; and the expansion is bounded itself (MAX_FIELDS), so what an
operation would execute after its fragments are spread is refused before it
runs, with a message naming the bound.

The measures (per operation; fragments spread, inline fragments at their
own level):

- depth: fields with a selection nested in one another, introspection
  fields not counted (graphql-core's MaxIntrospectionDepthRule bounds
  those), as QueryDepthLimiter counted it: at most MAX_QUERY_DEPTH;
- aliases: aliased fields, counted over the document's operations, as
  MaxAliasesLimiter counted them: at most MAX_ALIASES;
- fields: every field once per place it lands after spreading, `__typename`
  and introspection included (they run too): at most MAX_FIELDS.

A fragment that spreads itself, directly or not, counts nothing where it
comes back (NoFragmentCyclesRule refuses the document); an unknown fragment
counts nothing (KnownFragmentNamesRule refuses it). The walk keeps its own
stack: a chain of thousands of fragments never meets Python's recursion limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from graphql import (
    ASTValidationRule,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
)

from .request_errors import VALIDATION_FAILED

MAX_QUERY_DEPTH: Final = 12
# Aliases multiply resolver calls (`a1: nodes ... a999: nodes` is 999 list
# queries). Generous for any real client: the agent's mutations use variables
# and a few dozen tokens.
MAX_ALIASES: Final = 100
# Tokens bound the parse (MaxTokensLimiter): a document's text, not its expansion.
MAX_TOKENS: Final = 5000
# Fields of one operation once its fragments are spread. The largest document
# a client of ours sends is the introspection query GraphiQL and codegen send
# (229 fields with every option); the dashboard's node page selects 49
# (tests/api/test_document_cost.py measures them).
MAX_FIELDS: Final = 1000

# Measures above this are all "too many": counts stay small integers however
# many times a chain of fragments doubles.
_SATURATED: Final = 1 << 40


@dataclass(frozen=True, slots=True)
class Measure:
    depth: int
    aliases: int
    fields: int


_NOTHING: Final = Measure(0, 0, 0)


def _add(total: int, more: int) -> int:
    return min(total + more, _SATURATED)


def _count(value: int) -> str:
    return f"more than {_SATURATED:,}" if value >= _SATURATED else f"{value:,}"


class Measurer:
    """Measures of a document's selection sets, each computed once."""

    def __init__(self, fragments: dict[str, FragmentDefinitionNode]) -> None:
        self._fragments = fragments
        # By id of the selection set node; None while it is being measured
        # (met again then: a fragment cycle, which counts nothing).
        self._measures: dict[int, Measure | None] = {}

    def _children(self, selection_set: SelectionSetNode) -> list[SelectionSetNode]:
        """The selection sets this one's measure needs first."""
        found = []
        for selection in selection_set.selections:
            if isinstance(selection, FragmentSpreadNode):
                fragment = self._fragments.get(selection.name.value)
                if fragment is not None:
                    found.append(fragment.selection_set)
            elif (
                isinstance(selection, (FieldNode, InlineFragmentNode))
                and selection.selection_set is not None
            ):
                found.append(selection.selection_set)
        return found

    def measure(self, root: SelectionSetNode) -> Measure:
        """The measure of a selection set: a post-order walk with its own stack."""
        stack: list[tuple[SelectionSetNode, bool]] = [(root, False)]
        while stack:
            selection_set, ready = stack.pop()
            key = id(selection_set)
            if ready:
                self._measures[key] = self._combine(selection_set)
                continue
            if key in self._measures:
                continue  # measured, or being measured (a cycle)
            self._measures[key] = None
            stack.append((selection_set, True))
            stack.extend(
                (child, False)
                for child in self._children(selection_set)
                if id(child) not in self._measures
            )
        return self._measures[id(root)] or _NOTHING

    def _of(self, selection_set: SelectionSetNode | None) -> Measure:
        if selection_set is None:
            return _NOTHING
        return self._measures.get(id(selection_set)) or _NOTHING

    def _combine(self, selection_set: SelectionSetNode) -> Measure:
        depth = aliases = fields = 0
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                inner = self._of(selection.selection_set)
                if selection.selection_set is not None and not selection.name.value.startswith(
                    "__"
                ):
                    depth = max(depth, inner.depth + 1)
                aliases = _add(aliases, inner.aliases + (1 if selection.alias else 0))
                fields = _add(fields, inner.fields + 1)
                continue
            if isinstance(selection, FragmentSpreadNode):
                fragment = self._fragments.get(selection.name.value)
                inner = self._of(fragment.selection_set if fragment is not None else None)
            else:
                assert isinstance(selection, InlineFragmentNode)
                inner = self._of(selection.selection_set)
            depth = max(depth, inner.depth)
            aliases = _add(aliases, inner.aliases)
            fields = _add(fields, inner.fields)
        return Measure(depth, aliases, fields)


def operation_name(operation: OperationDefinitionNode) -> str:
    return operation.name.value if operation.name else "anonymous"


class DocumentCost(ASTValidationRule):
    """Refuses a document past MAX_QUERY_DEPTH, MAX_ALIASES or MAX_FIELDS, each fragment measured once."""

    def __init__(self, context: ValidationContext) -> None:
        super().__init__(context)
        definitions = context.document.definitions
        fragments = {d.name.value: d for d in definitions if isinstance(d, FragmentDefinitionNode)}
        measurer = Measurer(fragments)
        aliases = 0
        for operation in definitions:
            if not isinstance(operation, OperationDefinitionNode):
                continue
            measure = measurer.measure(operation.selection_set)
            aliases = _add(aliases, measure.aliases)
            name = operation_name(operation)
            if measure.depth > MAX_QUERY_DEPTH:
                context.report_error(
                    GraphQLError(
                        f"'{name}' is {measure.depth} fields deep, more than the maximum "
                        f"operation depth of {MAX_QUERY_DEPTH}",
                        operation,
                        extensions={"code": VALIDATION_FAILED},
                    )
                )
            if measure.fields > MAX_FIELDS:
                context.report_error(
                    GraphQLError(
                        f"'{name}' selects {_count(measure.fields)} fields once its fragments "
                        f"are spread, more than the maximum of {MAX_FIELDS:,} fields per operation",
                        operation,
                        extensions={"code": VALIDATION_FAILED},
                    )
                )
        if aliases > MAX_ALIASES:
            context.report_error(
                GraphQLError(
                    f"{_count(aliases)} aliases found. Allowed: {MAX_ALIASES}",
                    extensions={"code": VALIDATION_FAILED},
                )
            )


# Rules a document is checked by before graphql-core's (checked_documents.py):
# cheap, linear, and refusing what would make the others' work large.
FIRST_RULES: Final = (DocumentCost,)
