"""Parsed and validated GraphQL documents, kept per query text.

Every agent sends the same two documents (heartbeat, registerNode) and every
scheduler the same few, thousands of times a second across a cluster. Parsing
and validating them again for each request is work whose answer never
changes, so the first request of a text pays for it and later ones look it up.

A text that fails to parse or validate is remembered as such: the front door
then declines the request (reason `document_not_valid`) and Strawberry's view
reports those errors in its own words. The rules and the token limit are the
schema's own extensions' (extensions.py). The cache is bounded (least recently used out) and long texts are not
kept, so a client sending endless distinct documents costs memory for at most
`max_entries` of them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from graphql import (
    ASTValidationRule,
    DocumentNode,
    FieldNode,
    GraphQLError,
    GraphQLSchema,
    OperationDefinitionNode,
    OperationType,
    parse,
    specified_rules,
)

from service.graphql.private_api import validate_document

# Agents' documents are a few hundred bytes; a page query a few kilobytes.
MAX_CACHED_LENGTH: Final = 16_384
MAX_ENTRIES: Final = 512


@dataclass(frozen=True)
class Prepared:
    """A document that parsed and passed the schema's validation, with its operations."""

    document: DocumentNode
    operations: dict[str | None, OperationDefinitionNode]
    # Per operation name, the front door's plan of it (front_door.Plan),
    # made on first use and kept as long as the document is.
    plans: dict[str | None, Any] = field(default_factory=dict)

    def operation(self, name: str | None) -> OperationDefinitionNode | None:
        """The operation to run, as graphql-core picks it; None when that would be an error."""
        if name is None:
            if len(self.operations) != 1:
                return None
            return next(iter(self.operations.values()))
        return self.operations.get(name)


_INVALID: Final = object()


class PreparedDocuments:
    """query text -> Prepared, or None for a text that Strawberry must answer."""

    def __init__(
        self,
        schema: GraphQLSchema,
        extra_rules: tuple[type[ASTValidationRule], ...],
        max_tokens: int | None,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._schema = schema
        # The same rules, in the same order, as Strawberry's validation of a
        # request with the schema's AddValidationRules extension.
        self._rules = (*specified_rules, *extra_rules)
        self._max_tokens = max_tokens
        self._max_entries = max_entries
        self._entries: OrderedDict[str, Prepared | object] = OrderedDict()

    def get(self, query: str) -> Prepared | None:
        entry = self._entries.get(query)
        if entry is not None:
            self._entries.move_to_end(query)
            return entry if isinstance(entry, Prepared) else None
        prepared = self._prepare(query)
        if len(query) <= MAX_CACHED_LENGTH:
            self._entries[query] = _INVALID if prepared is None else prepared
            if len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return prepared

    def _prepare(self, query: str) -> Prepared | None:
        try:
            document = parse(query, max_tokens=self._max_tokens)
        except GraphQLError:
            return None
        if validate_document(self._schema, document, self._rules):
            return None
        operations: dict[str | None, OperationDefinitionNode] = {}
        for definition in document.definitions:
            if isinstance(definition, OperationDefinitionNode):
                name = definition.name.value if definition.name else None
                operations[name] = definition
        return Prepared(document=document, operations=operations)

    def __len__(self) -> int:
        return len(self._entries)


def only_root_field(operation: OperationDefinitionNode, kind: OperationType) -> FieldNode | None:
    """The operation's one root field, when it is of this kind and asks for nothing else.

    The shape every compiled operation starts from (compiled_heartbeat.py,
    compiled_page.py): no directives on the operation or the field, no
    fragment at the root.
    """
    if operation.operation != kind or operation.directives:
        return None
    selections = operation.selection_set.selections
    if len(selections) != 1 or not isinstance(selections[0], FieldNode):
        return None
    root = selections[0]
    return None if root.directives else root
