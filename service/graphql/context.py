"""What every resolver of one request shares: the engine, settings and that request's loaders."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine
from strawberry.types import Info as StrawberryInfo

from service.access_control.auth import Authenticator, Principal
from service.config import Settings
from service.database import connections, read_routing
from service.database.connections import Connection
from service.database.transactions import in_transaction
from service.event_log.event_stream import Subscription
from service.graphql.loaders import Loaders
from service.paging import PageRequest, page_request

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
    # Who is calling (service/access_control/auth.py); None on a websocket until its
    # connection_init carried a token, and every root field refuses None.
    principal: Principal | None = None
    authenticator: Authenticator | None = None
    # graphql-transport-ws connection_init payload (strawberry fills it in).
    connection_params: dict[str, Any] | None = None
    # A websocket's token ended (service/access_control/token_watch.py): "token revoked" or
    # "token expired". Every later operation on the socket is refused, and
    # its open subscriptions (`streams`) are ended with that error.
    token_ended: str | None = None
    streams: set[Subscription] = field(default_factory=set)
    # What a heartbeat or report that sent runningShards is told to stop, by
    # node id, for Node.shardsToStop (service/fleet/fencing.py).
    shards_to_stop: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def end_token(self, status: str) -> None:
        from service.access_control.auth import Unauthenticated

        self.token_ended = f"token {status}"
        for stream in list(self.streams):
            stream.end(Unauthenticated(f"{self.token_ended}: this subscription ended"))

    async def write(
        self, work: Callable[[Connection], Awaitable[T]], *, idempotent: bool = False
    ) -> T:
        """Run one mutation's work in one transaction (service/database/transactions.py).

        Retried on a lost conflict and while the database is away;
        `idempotent`: a second run finds the first one's effect and answers
        it, so it may run again even when COMMIT's outcome was lost.
        """
        return await in_transaction(self.engine, work, idempotent=idempotent)

    async def what_if(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """Run work that writes only to ask what would happen, on the primary, always rolled back.

        explainPlacement's victim trials (connections.rolled_back): nothing of
        it is committed, and no lock it took outlives it.
        """
        async with connections.rolled_back(self.engine) as conn:
            return await work(conn)

    async def read(
        self,
        work: Callable[[Connection], Awaitable[T]],
        *,
        max_age: float | None = None,
        transaction: bool = False,
    ) -> T:
        """Run a read where the request's reads go (service/database/read_routing.py).

        A read replica when the request tolerates staleness (read_routes.py)
        and one is close enough behind (`max_age`: the request's own bound,
        when it names one), else the primary. `transaction`: in one READ ONLY
        transaction.
        """
        return await read_routing.read(self.engine, work, max_age=max_age, transaction=transaction)

    def page_request(self, first: int | None) -> PageRequest:
        """The page a list's `first` asks for (service/paging.py): BAD_INPUT naming `first` if out of range."""
        return page_request(first, self.settings.max_page_size)


def new_context(engine: AsyncEngine, settings: Settings, **extra: Any) -> Context:
    return Context(engine=engine, settings=settings, loaders=Loaders(engine), **extra)


Info = StrawberryInfo[Context, None]
