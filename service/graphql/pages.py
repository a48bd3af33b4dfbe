"""A list field's answer from a Page: its entries, and PAGE_TRUNCATED when it stopped short.

graphql-core gives a resolver no way to answer a value and an error for the
same field: raising nulls the field. So the resolver returns a Truncated
list, which carries the error, and the execution context (PageTruncation,
part of the schema's on every route, fast or not) adds the error at that
field's path and completes the entries as a plain list. The fast page route
(compiled_page.py) places the same error at the same path itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from graphql import (
    ExecutionResult,
    ExperimentalIncrementalExecutionResults,
    GraphQLError,
    GraphQLOutputType,
    GraphQLResolveInfo,
    located_error,
)
from graphql.pyutils import AwaitableOrValue, Path

from service.paging import Page, PageTruncated

from .private_api import (
    FieldDetailsList,
    StrawberryGraphQLCoreExecutionContext,
    add_field_errors,
)

T = TypeVar("T")
R = TypeVar("R")


class Truncated(list[T]):
    """The entries of a page that stopped short, with the error its field answers too."""

    __slots__ = ("error",)

    def __init__(self, entries: Iterable[T], error: PageTruncated) -> None:
        super().__init__(entries)
        self.error = error


def answer(page: Page[R], convert: Callable[[R], T]) -> list[T]:
    """The field's value: the page's entries converted, marked when the list stopped short."""
    entries = [convert(entry) for entry in page.entries]
    return entries if page.truncated is None else Truncated(entries, page.truncated)


def paged(what: str, cursor: str = "id") -> str:
    """A paged list field's description: what it lists, then how its pages work."""
    return (
        f"{what} Pass the last {cursor} of a page as `after` for the next one; an `after` that"
        " names nothing continues from where it would sort. `first` is 1 to"
        " INVENTORY_MAX_PAGE_SIZE. Without `first`, one page of INVENTORY_MAX_PAGE_SIZE"
        " entries and, when there are more, an error at this field with extensions.code"
        " PAGE_TRUNCATED and extensions.after, the cursor that continues."
    )


class PageTruncation(StrawberryGraphQLCoreExecutionContext):
    """Places each Truncated list's PAGE_TRUNCATED error at the list's path.

    Comes first in the schema's execution context (schema.py), so the value
    the next context completes (execution.py's plain-field completion) is a
    plain list.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._truncated: list[tuple[Path, FieldDetailsList, PageTruncated]] = []

    def complete_value(
        self,
        return_type: GraphQLOutputType,
        field_details_list: FieldDetailsList,
        info: GraphQLResolveInfo[Any],
        path: Path,
        result: Any,
        position_context: Any,
    ) -> AwaitableOrValue[Any]:
        if type(result) is Truncated:
            # Its entries are the answer; its error is added at this path once
            # execution is done (build_response).
            self._truncated.append((path, field_details_list, result.error))
            result = list(result)
        return super().complete_value(
            return_type, field_details_list, info, path, result, position_context
        )

    def build_response(
        self, data: dict[str, Any] | None
    ) -> ExecutionResult | ExperimentalIncrementalExecutionResults:
        """graphql-core's response, with each short list's PAGE_TRUNCATED error at its path.

        Not for a list that an error nulled meanwhile (it answers no page), as
        graphql-core keeps no error under a nulled position either.
        """
        truncated = [
            (path, located_error(error, [d.node for d in field_details_list], path.as_list()))
            for path, field_details_list, error in self._truncated
        ]
        # In the document's order, not the order concurrent resolvers finished in.
        truncated.sort(key=lambda entry: _document_order(entry[1]))
        add_field_errors(self, truncated)
        return super().build_response(data)


def _document_order(error: GraphQLError) -> tuple[Any, ...]:
    """Where a field's error sits: its place in the document, then its list indices."""
    place = [(location.line, location.column) for location in error.locations or ()]
    return (place, [(0, p) if isinstance(p, int) else (1, p) for p in error.path or ()])
