"""One HTTP request's answer on its way out: the one wrapper of uvicorn's `send`.

Every HTTP response leaves through here once, and here it gets what every
response needs: its status recorded (the latency histogram and the access
log read it), the request's X-Request-Id header, `Connection: close` while
the process drains (web/draining.py), and the end of the request's time limit
once the answer has started (a streamed subscription may run for hours).

These were four middlewares, each wrapping `send` for one of them, plus
Starlette's own two: six nested wrappers on the way out, each copying the
start message, were a large share of a heartbeat's CPU. Code that holds the
whole answer (the fast path, the guards' refusals) calls `answer`, which
builds the response's start once and hands both messages to uvicorn.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.database.db_faults import RETRY_AFTER_SECONDS
from service.database.request_state import RequestState
from service.web.draining import Drain
from service.web.http_guards import Message, Send
from service.web.time_limits import Limit

REQUEST_ID_HEADER = b"x-request-id"
RETRY_AFTER = b"retry-after"
JSON = b"application/json"


class Exchange:
    """The `send` of one HTTP request (an ASGI send callable), and what it has sent so far."""

    __slots__ = ("_drain", "_request_id", "_send", "_state", "limit", "started", "status")

    def __init__(
        self, send: Send, request_id: str, drain: Drain, state: RequestState | None = None
    ) -> None:
        self._send = send
        self._request_id = request_id.encode()
        self._drain = drain
        self._state = state
        self.started = False
        # 500 until a response starts: a request that ends without one failed.
        self.status = 500
        # The request's time limit while it runs (graphql_endpoint.py), ended
        # by the response's start.
        self.limit: Limit | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = self._start(int(message["status"]), message.get("headers", ()))
            message = {**message, "headers": headers}
        await self._send(message)

    async def answer(
        self,
        status: int,
        body: bytes,
        content_type: bytes = JSON,
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        """The whole response at once: status, body and any extra headers."""
        start = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        start.extend(headers)
        await self._send(
            {"type": "http.response.start", "status": status, "headers": self._start(status, start)}
        )
        await self._send({"type": "http.response.body", "body": body})

    def _start(
        self, status: int, headers: Iterable[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        self.started = True
        self.status = status
        if self.limit is not None:
            self.limit.end()
        out = list(headers)
        out.append((REQUEST_ID_HEADER, self._request_id))
        if (
            self._state is not None
            and self._state.unavailable
            and not any(name.lower() == RETRY_AFTER for name, _ in out)
        ):
            out.append((RETRY_AFTER, b"%d" % RETRY_AFTER_SECONDS))
        if self._drain.closing:
            # Proxies drop their keep-alive connection to this process after
            # this answer instead of racing its shutdown.
            out = [(name, value) for name, value in out if name.lower() != b"connection"]
            out.append((b"connection", b"close"))
        return out
