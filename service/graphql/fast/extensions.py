"""What the schema's Strawberry extensions ask of a request, read from the schema itself.

The fast path runs none of Strawberry's extension hooks. It honours each
extension the schema is built with in its own way, by the table below, read
from `schema.get_extensions()` (the list Strawberry itself runs), so the
extensions are never copied by hand. An extension the table does not know
(a new limiter, a tracing hook, a schema directive's extension) is not
skipped: the front door then declines every request, reason
`extension_not_honoured`, and names it in a warning at startup, so the
service stays right (Strawberry's view answers) and says why it is slower.

| extension | honoured by |
| --- | --- |
| MaskUnexpected (masking.py) | direct.py masks the same errors with the same function |
| MaxTokensLimiter | the parser's token limit (documents.py) |
| AddValidationRules (the schema's: DocumentCost, CheckedLiterals; or any limiter's) | their rules, in order, after graphql-core's (documents.py) |
| DocumentChecks (checked_documents.py) | documents.py checks through the same cache (off the event loop when long); an operation of several without a name is not planned (declined: operation_not_found); the front door runs the same variables' check (declined: text_not_storable, list_too_long) |
| ParserCache, ValidationCache | nothing to do: documents.py keeps parsed, validated documents itself |
| CodeValidationErrors (request_errors.py) | nothing to do: only documents that validated run here; Strawberry's view answers the rest |
| ReadRouting (read_routes.py) | the front door's plan gives the request the same verdict, from the same function (front_door.py) |
"""

from __future__ import annotations

from dataclasses import dataclass

import strawberry
from graphql import ASTValidationRule
from strawberry.extensions import (
    AddValidationRules,
    MaxTokensLimiter,
    ParserCache,
    ValidationCache,
)

from service.graphql.checked_documents import DocumentChecks
from service.graphql.masking import MaskUnexpected
from service.graphql.read_routes import ReadRouting
from service.graphql.request_errors import CodeValidationErrors

# Extensions whose whole effect the fast path has by construction.
_NOTHING_TO_DO: tuple[type, ...] = (
    MaskUnexpected,
    DocumentChecks,
    ParserCache,
    ValidationCache,
    CodeValidationErrors,
    ReadRouting,
)


@dataclass(frozen=True)
class Extensions:
    """The schema's extensions, as the fast path honours them."""

    rules: tuple[type[ASTValidationRule], ...]
    max_tokens: int | None
    # Names of the extensions the fast path cannot honour (empty: it may answer).
    not_honoured: tuple[str, ...]


def read_extensions(schema: strawberry.Schema) -> Extensions:
    rules: list[type[ASTValidationRule]] = []
    max_tokens: int | None = None
    not_honoured: list[str] = []
    for extension in schema.get_extensions():
        kind = type(extension)
        if kind in _NOTHING_TO_DO:
            continue
        if kind is MaxTokensLimiter:
            assert isinstance(extension, MaxTokensLimiter)
            count = extension.max_token_count
            max_tokens = count if max_tokens is None else min(max_tokens, count)
        elif isinstance(extension, AddValidationRules) and _only_validates(kind):
            rules.extend(extension.validation_rules)
        else:
            not_honoured.append(kind.__name__)
    return Extensions(tuple(rules), max_tokens, tuple(not_honoured))


def _only_validates(kind: type) -> bool:
    """A subclass of AddValidationRules that adds rules and no hook of its own."""
    hooks = ("on_operation", "on_validate", "on_parse", "on_execute", "resolve", "get_results")
    return all(getattr(kind, hook) is getattr(AddValidationRules, hook) for hook in hooks)
