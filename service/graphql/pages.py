"""A list field's answer from a Page: its entries, and PAGE_TRUNCATED when it stopped short.

graphql-core gives a resolver no way to answer a value and an error for the
same field: raising nulls the field. So the resolver returns a Truncated
list, which carries the error; the execution context (execution.py), which
knows the field's path and nodes, adds the error at that path and completes
the entries as a plain list. The fast page route (compiled_page.py) places
the same error at the same path itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from service.paging import Page, PageTruncated

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
