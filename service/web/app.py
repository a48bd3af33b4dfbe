"""The Starlette application: GraphQL at /graphql, and the process's lifecycle."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cross_web import HTTPException
from graphql import GraphQLError, OperationType, get_operation_ast, parse
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.http import GraphQLRequestData
from strawberry.schema.exceptions import InvalidOperationTypeError
from strawberry.types.unset import UNSET, UnsetType

from service.access_control.auth import Authenticator
from service.access_control.token_watch import TokenWatch
from service.config import Settings
from service.database.db import create_engine, dispose
from service.event_log.event_announcements import drain_announcements
from service.fleet.health import policy
from service.graphql.authentication import accept_connection, identify, identify_http
from service.graphql.context import Context, new_context
from service.graphql.schema import schema
from service.web.assets import STATIC_DIR, VENDOR_DIR
from service.web.draining import Drain
from service.web.graphiql import GraphiQLPage
from service.web.graphql_endpoint import FrontDoor, GraphQLEndpoint
from service.web.graphql_ws import CheckedLegacyWS, CheckedTransportWS
from service.web.http_guards import decode_json_body
from service.web.logs import current_request_id, new_request_id
from service.web.operations import Background, operational_routes
from service.web.request_cycle import RequestCycle

if TYPE_CHECKING:  # imported only when traces are on
    from service.web.tracing import Tracing

log = logging.getLogger(__name__)


class InventoryGraphQL(GraphQL[Context, None]):
    graphql_transport_ws_handler_class = CheckedTransportWS
    graphql_ws_handler_class = CheckedLegacyWS

    def __init__(
        self, engine_ref: EngineRef, settings: Settings, vendor_dir: Path = VENDOR_DIR
    ) -> None:
        super().__init__(schema, graphql_ide="graphiql")
        self._engine_ref = engine_ref
        self._settings = settings
        self._graphiql = GraphiQLPage(self.graphql_ide_html, vendor_dir)
        self.authenticator = Authenticator(lambda: engine_ref.engine, settings)
        self.token_watch = TokenWatch(lambda: engine_ref.engine)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if scope["type"] == "websocket":
                self.token_watch.forget(id(scope))

    async def render_graphql_ide(self, request: Request) -> Response:
        # Local copies of GraphiQL's scripts when fetched (air-gapped clusters), else the CDN.
        return HTMLResponse(self._graphiql.html())

    def _new_context(
        self, request: Request | WebSocket, response: Response | WebSocket | None
    ) -> Context:
        return new_context(
            self._engine_ref.engine,
            self._settings,
            request=request,
            response=response,
            request_id=current_request_id() or new_request_id(),
        )

    async def get_context(
        self, request: Request | WebSocket, response: Response | WebSocket | None
    ) -> Context:
        context = self._new_context(request, response)
        await identify(context, request, self.authenticator)
        return context

    def http_context(self, request: Request) -> Context:
        """The context of an HTTP request, its caller already checked (service/web/http_guards.py)."""
        context = self._new_context(request, None)
        identify_http(context, request, self.authenticator)
        return context

    def asgi_context(self, scope: Scope, receive: Receive) -> Context:
        """http_context of an ASGI request: what the fast path makes when it needs a Context."""
        return self.http_context(Request(scope, receive))

    async def execute_single(self, *args: Any, **kwargs: Any) -> Any:
        request_data: GraphQLRequestData | None = kwargs.get("request_data")
        if (
            request_data is not None
            and request_data.protocol == "http"
            and _is_subscription(request_data.query, request_data.operation_name)
        ):
            # Without a stream to answer on, graphql-core ran the subscription
            # as a query and the client got an internal error (and the log a
            # traceback) for its own mistake.
            raise HTTPException(
                400,
                "a subscription needs a stream: graphql-transport-ws on /graphql, "
                "or Accept: text/event-stream",
            )
        try:
            return await super().execute_single(*args, **kwargs)
        except HTTPException as refused:
            # GraphQL over HTTP: a mutation sent with GET is 405 Method Not
            # Allowed (Strawberry says 400); graphql_http.Negotiated makes it JSON.
            if isinstance(refused.__cause__, InvalidOperationTypeError):
                raise HTTPException(405, refused.reason) from refused
            raise

    def decode_json(self, data: str | bytes) -> object:
        return decode_json_body(data)

    async def on_ws_connect(self, context: Context) -> UnsetType:
        # Every websocket operation (subscriptions included) is refused
        # until connection_init carried a valid token.
        await accept_connection(context)
        token_id = context.principal.token_id if context.principal is not None else None
        if token_id is not None and context.principal is not None and context.principal.stored:
            # A websocket outlives the check above: end it when its token ends.
            self.token_watch.watch(id(context.request.scope), token_id, context.end_token)
        ack: UnsetType = UNSET
        return ack


def _is_subscription(query: str | None, operation_name: str | None) -> bool:
    if not query or "subscription" not in query:  # most requests: no parse
        return False
    try:
        operation = get_operation_ast(parse(query), operation_name)
    except GraphQLError:
        return False  # Strawberry's view words the syntax error
    return operation is not None and operation.operation == OperationType.SUBSCRIPTION


class EngineRef:
    """The engine, created in the lifespan (it belongs to the server's event loop)."""

    def __init__(self, engine: AsyncEngine | None = None) -> None:
        self._engine = engine

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("the database engine is not started")
        return self._engine

    def set(self, engine: AsyncEngine | None) -> None:
        self._engine = engine


def create_app(
    settings: Settings,
    *,
    database_url: str | None = None,
    engine: AsyncEngine | None = None,
    on_shutdown: Callable[[], None] | None = None,
    sweep: bool = True,
    vendor_dir: Path = VENDOR_DIR,
    tracing: Tracing | None = None,
) -> RequestCycle:
    """An app over an existing engine (tests) or one it creates at startup from database_url.

    Its lifespan starts the liveness sweep (unless sweep=False, for tests that
    drive service.fleet.liveness.sweep themselves) and the event stream.
    With `tracing` (web/tracing.py: the OTEL_* variables asked for it), every
    GraphQL operation is a span and every statement one of its children; its
    lifespan's end flushes them. Without, nothing of it is on any request's path.
    """
    # The remediation policy in force for this process (built in, or the
    # file's overrides): a file that cannot be used stops the start here.
    policy.install(policy.load(settings.remediation_policy))
    ref = EngineRef(engine)
    owns_engine = engine is None
    graphql_app = InventoryGraphQL(ref, settings, vendor_dir)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if owns_engine:
            if database_url is None:
                raise RuntimeError("create_app needs database_url or engine")
            ref.set(create_engine(database_url, settings))
        background = await Background.start(app, ref.engine, settings, sweep=sweep)
        try:
            yield
        finally:
            await graphql_app.token_watch.stop()
            await background.stop()
            # Events committed in the last moments are still announced.
            await drain_announcements(ref.engine)
            if owns_engine:
                await dispose(ref.engine)
                ref.set(None)
            if tracing is not None:
                tracing.close()
            if on_shutdown is not None:
                # The embedded PostgreSQL stops here: uvicorn re-raises
                # SIGTERM after shutdown, so atexit hooks would never run.
                on_shutdown()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def dashboard(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "dashboard.html", media_type="text/html")

    drain = Drain()  # begun by SIGTERM (web/draining.py)
    front_door: FrontDoor | None = None
    if settings.fast_path:
        # The fast path's one registration (service/graphql/fast/switch.py):
        # deleting this block and the package leaves the whole service
        # (tests/fast_path/test_removable.py). Imported here, so that switched
        # off the fast package is never loaded: the schema does not need it,
        # and its hooks are installed only now.
        from service.graphql.fast.install import install

        front_door = install(schema, lambda: ref.engine, settings)
    endpoint = GraphQLEndpoint(
        graphql_app, front_door, graphql_app.authenticator, settings, graphql_app.asgi_context
    )
    routes: list[Any] = [
        # RequestCycle calls the endpoint itself for GET, HEAD and POST; the
        # route answers the other methods (405).
        Route("/graphql", endpoint, methods=["GET", "POST"]),
        WebSocketRoute("/graphql", graphql_app),
        Route("/healthz", healthz),
        *operational_routes(lambda: ref.engine, settings, drain),
        # The dashboard and GraphiQL's scripts are public: a browser fetches
        # them before anyone can type a token into the page.
        Route("/", dashboard, methods=["GET"]),
        Mount("/static/vendor", StaticFiles(directory=vendor_dir, check_dir=False)),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.drain = drain
    app.state.engine_ref = ref
    app.state.settings = settings
    if tracing is not None:
        from service.web.tracing import RecordingExchange, TracedEndpoint

        tracing.instrument_database()
        return RequestCycle(app, TracedEndpoint(endpoint, tracing), drain, RecordingExchange)
    return RequestCycle(app, endpoint, drain)
