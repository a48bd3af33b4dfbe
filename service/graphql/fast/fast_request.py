"""A request as a compiled route sees it: who calls, the engine, the settings; its Context on demand.

Why not the GraphQL Context (service/graphql/context.py) itself: making one
(a Starlette Request, the Context's fields, its loaders, the caller put into
it) for every heartbeat is work a beat does not need: the heartbeat, node
and page routes read only the caller, the engine and the settings. So the Context is made the
first time something needs it: graphql_core running the operation, or a
route whose domain call takes the Context (registration, place). Made
once: graphql_core, after a route declined, runs with the route's Context.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control.auth import Principal
from service.config import Settings
from service.database import read_routing
from service.database.connections import NativeConnection
from service.graphql.context import Context
from service.paging import PageRequest, page_request

T = TypeVar("T")


class FastRequest:
    __slots__ = ("_context", "_make_context", "engine", "principal", "settings")

    def __init__(
        self,
        principal: Principal | None,
        engine: AsyncEngine,
        settings: Settings,
        make_context: Callable[[], Context],
    ) -> None:
        # The Principal the Context would carry (graphql/authentication.py: caller_of).
        self.principal = principal
        self.engine = engine
        self.settings = settings
        self._make_context = make_context
        self._context: Context | None = None

    def context(self) -> Context:
        """The request's GraphQL Context, made on first use."""
        if self._context is None:
            self._context = self._make_context()
        return self._context

    async def read(
        self, work: Callable[[NativeConnection], Awaitable[T]], *, max_age: float | None = None
    ) -> T:
        """Context.read without the Context: where the request's reads go (read_routing.py)."""
        return await read_routing.read(self.engine, work, max_age=max_age)

    def page_request(self, first: int | None) -> PageRequest:
        """Context.page_request without the Context."""
        return page_request(first, self.settings.max_page_size)
