"""Parsed and validated GraphQL documents, kept per query text, with the fast path's plans of them.

Every agent sends the same two documents (heartbeat, registerNode) and every
scheduler the same few, thousands of times a second across a cluster. Parsing
and validating them again for each request is work whose answer never
changes, so the first request of a text pays for it and later ones look it up.

The check itself is the one Strawberry's view makes
(service/graphql/checked_documents.py: the same cache, the same rules and
token limit, the extensions' own, read by extensions.py; long documents
checked off the event loop). A text that fails to parse or validate is
remembered as such: the front door then declines the request (reason
`document_not_valid`) and Strawberry's view reports those errors in its own
words. The cache is bounded (least recently used out) and long texts are not
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
    GraphQLSchema,
    OperationDefinitionNode,
    OperationType,
    specified_rules,
)

from service.graphql.checked_documents import MAX_CACHED_LENGTH, Checked, checked_documents

MAX_ENTRIES: Final = 512


@dataclass(frozen=True)
class Prepared:
    """A document that parsed and passed the schema's validation, with its operations."""

    checked: Checked
    # Per operation name, the front door's plan of it (front_door.Plan),
    # made on first use and kept as long as the document is.
    plans: dict[str | None, Any] = field(default_factory=dict)

    @property
    def document(self) -> DocumentNode:
        document = self.checked.document
        assert document is not None, "a prepared document parsed"
        return document

    @property
    def operations(self) -> dict[str | None, OperationDefinitionNode]:
        return self.checked.operations

    def operation(self, name: str | None) -> OperationDefinitionNode | None:
        """The operation to run, as graphql-core picks it; None when that would be an error."""
        return self.checked.operation(name)


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
        self._checked = checked_documents(schema)
        # The same rules, in the same order, as Strawberry's validation of a
        # request with the schema's AddValidationRules extension.
        self._rules = (*specified_rules, *extra_rules)
        self._max_tokens = max_tokens
        self._max_entries = max_entries
        self._entries: OrderedDict[str, Prepared | object] = OrderedDict()

    async def get(self, query: str) -> Prepared | None:
        entry = self._entries.get(query)
        if entry is not None:
            self._entries.move_to_end(query)
            return entry if isinstance(entry, Prepared) else None
        checked = await self._checked.check(query, self._rules, self._max_tokens)
        prepared = None if checked.errors or checked.document is None else Prepared(checked)
        if len(query) <= MAX_CACHED_LENGTH:
            self._entries[query] = _INVALID if prepared is None else prepared
            if len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return prepared

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
