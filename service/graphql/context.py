"""What every resolver of one request shares: the engine, settings and that request's loaders."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine
from strawberry.types import Info as StrawberryInfo

from service.auth import Authenticator, Principal
from service.config import Settings
from service.connections import Connection
from service.graphql.loaders import Loaders
from service.paging import PageRequest, page_request
from service.transactions import in_transaction

T = TypeVar("T")


@dataclass
class Context:
    engine: AsyncEngine
    settings: Settings
    loaders: Loaders
    actor: str | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    request: Any = None
    response: Any = None
    # Who is calling (service/auth.py); None on a websocket until its
    # connection_init carried a token, and every root field refuses None.
    principal: Principal | None = None
    authenticator: Authenticator | None = None
    # graphql-transport-ws connection_init payload (strawberry fills it in).
    connection_params: dict[str, Any] | None = None

    async def write(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """Run one mutation's work in one transaction (retried on deadlock or serialization loss)."""
        return await in_transaction(self.engine, work)

    def page_request(self, first: int | None) -> PageRequest:
        """The page a list's `first` asks for (service/paging.py): BAD_INPUT naming `first` if out of range."""
        return page_request(first, self.settings.max_page_size)


def new_context(engine: AsyncEngine, settings: Settings, **extra: Any) -> Context:
    return Context(engine=engine, settings=settings, loaders=Loaders(engine), **extra)


Info = StrawberryInfo[Context, None]
