"""Pages of a list, and the one rule for saying that a list stopped short.

Every list that grows with the cluster (nodes, freeGpus, allocations, events,
tokens, a fabric's nodes) is read in pages sorted by id: `first` entries
after the id `after`. An `after` that names nothing (a node removed since, a
made-up id) continues from where that id would sort, so a caller paging
through a list that changes underneath never loses its place.

Why the error (issue 22): without `first` a list answers one page of
INVENTORY_MAX_PAGE_SIZE, and nothing in the answer said it had stopped. A
scheduler asking for free GPUs on 10,000 nodes got the first 1,000 entries
of 3,989, placed replicas on the first nodes by id and reported "no room"
for a class whose free GPUs sat on later ones. So a list called without
`first` reads one entry past its page: if that entry exists, the answer is
the page plus a PAGE_TRUNCATED error at the list's path carrying the cursor
that continues. A caller that passed `first` asked for a page and knows it:
its answer is unchanged. Every execution route takes the decision from here
(stops_short), so none can answer short in silence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from service.errors import InvalidInput, InventoryError

T = TypeVar("T")


@dataclass(frozen=True)
class PageRequest:
    """How many entries a list answers, and whether the caller chose that number."""

    size: int
    chosen: bool

    @property
    def limit(self) -> int:
        """Entries to read: one past a page the caller did not ask for, to know if there are more."""
        return self.size if self.chosen else self.size + 1


def page_request(first: int | None, max_page_size: int, field: str = "first") -> PageRequest:
    """The page `first` asks for; without it, the largest page (and the list says if it is short)."""
    if first is None:
        return PageRequest(max_page_size, chosen=False)
    if first < 1 or first > max_page_size:
        raise InvalidInput(field, first, f"must be between 1 and {max_page_size}")
    return PageRequest(first, chosen=True)


def stops_short(request: PageRequest, read: int) -> bool:
    """Whether `read` entries, read with request.limit, are more than the answer may say in silence."""
    return not request.chosen and read > request.size


class PageTruncated(InventoryError):
    """A list called without `first` has more entries than one page: here is how to go on.

    Not a failure of the request: the page is in `data`, and this error sits at
    the list's path so that a client that does not page cannot miss it.
    """

    code = "PAGE_TRUNCATED"

    def __init__(self, after: str, page_size: int) -> None:
        super().__init__(
            f"this list has more than {page_size} entries and answered the first {page_size};"
            f" pass first (at most {page_size}) and after: {after!r} for the next page"
        )
        self.after = after
        self.page_size = page_size

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "after": self.after, "pageSize": self.page_size}


@dataclass(frozen=True)
class Page(Generic[T]):
    """The entries a list answers, and the error to add when it stopped short."""

    entries: Sequence[T]
    truncated: PageTruncated | None = None


def cut(rows: Sequence[T], request: PageRequest, cursor: Callable[[T], str]) -> Page[T]:
    """The page of `rows` (read with request.limit); `cursor` is an entry's id as `after` takes it."""
    if not stops_short(request, len(rows)):
        return Page(rows)
    kept = rows[: request.size]
    return Page(kept, PageTruncated(cursor(kept[-1]), request.size))
