"""SIGTERM: leave the load balancer first, then stop, so that no request in flight fails.

Through nginx in front of two replicas, a replica that simply stops
(uvicorn's default: close the listener and every idle keep-alive connection
at once) stalls requests until nginx's connect timeout, and loses requests: a
POST that nginx has written to a connection the replica then closes or resets
cannot be retried safely (it may have run), so nginx answers 502. A
connection can be lost that way in three places, and each is closed here:

- an idle keep-alive connection the replica closes just as the proxy reuses
  it. Only the proxy can close an idle connection without that race, so the
  replica never closes one itself before its keep-alive timeout (uvicorn's
  `timeout_keep_alive`, 5 s), and the proxy's own idle timeout must be
  shorter (deploy/nginx.conf: `keepalive_timeout 2s` in the upstream). The
  same race exists in steady state, where uvicorn's keep-alive timer closes
  connections nginx would keep for 60 s by default;
- a connection the kernel queued on the listener (or was completing) when
  the listener closes: it is reset after the proxy may have written its
  request. serve_the_backlog empties the queue before the close; what it
  cannot reach is a handshake under way at that very instant, so the close
  must come when the proxy opens (almost) no new connections: while it
  still reuses pooled ones. Hence no `Connection: close` before the close:
  during the drain each response would make the proxy open a new
  connection for its next request, about one per request, right up to the
  close;
- a connection closed before the request written on it was read:
  serve_the_backlog gives such connections time to have it read.

So on the first SIGTERM (`docker stop`, systemd, Kubernetes):

1. drain, for INVENTORY_SHUTDOWN_DRAIN seconds: /readyz answers 503
   "shutting down" (a load balancer that polls it, or Kubernetes' endpoint
   removal, stops sending new work); requests are served as usual;
2. stop accepting (serve_the_backlog): a proxy's next new connection is
   refused, which it may retry on another replica (nothing was sent), and a
   passive health check (nginx's max_fails) takes the replica out;
3. close the connections from the client's side: every response now carries
   `Connection: close` (web/exchange.py), so a proxy drops each connection after its current
   request, and idle ones are left for the proxy to close at its idle
   timeout; after uvicorn's keep-alive timeout whatever is left is closed as
   it would have been anyway;
4. uvicorn's own shutdown: let in-flight requests finish (at most
   INVENTORY_REQUEST_TIMEOUT more), close websockets with 1012 ("service
   restart": clients reconnect, to another replica), then the lifespan stops
   the background tasks and the pools.

A second SIGTERM, or Ctrl-C, skips what is left of the drain.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from types import FrameType
from typing import Any

import uvicorn

from service.config import Settings

log = logging.getLogger(__name__)


class Drain:
    """Whether this process is leaving the load balancer, and whether it stopped accepting."""

    def __init__(self) -> None:
        self.since: float | None = None
        # Set once the listener is closed: responses then end their connection.
        self.closing = False

    @property
    def draining(self) -> bool:
        return self.since is not None

    def begin(self) -> None:
        if self.since is None:
            self.since = time.monotonic()

    def close_connections(self) -> None:
        self.begin()
        self.closing = True


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain before its shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Drain, drain_seconds: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.drain_seconds = drain_seconds
        self._drain_until: float | None = None
        self._drain_logged = False

    @classmethod
    def run_app(cls, app: Any, settings: Settings, **options: Any) -> None:
        config = uvicorn.Config(
            app,
            # In-flight requests are bounded by the request timeout; a
            # websocket is closed (1012) at the start of the shutdown.
            timeout_graceful_shutdown=int(settings.request_timeout) + 1,
            **options,
        )
        cls(config, app.state.drain, settings.shutdown_drain).run()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._drain_until is None and self.drain_seconds > 0:
            # Signal handler: only flags here; main_loop's tick acts on them.
            self._captured_signals.append(sig)  # re-raised after shutdown, as uvicorn does
            self._drain_until = time.monotonic() + self.drain_seconds
            self.drain.begin()
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if self._drain_until is not None and not self._drain_logged:
            self._drain_logged = True
            log.info(
                "SIGTERM: draining for %g s (/readyz 503), then no longer accepting",
                self.drain_seconds,
            )
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            log.info("drained: no longer accepting; finishing requests in flight")
            return True
        return False

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.serve_the_backlog()
        await self.let_clients_close()
        await super().shutdown(sockets)

    async def let_clients_close(self) -> None:
        """Wait (at most the keep-alive timeout, plus a second) for the clients to close.

        Every response now says `Connection: close`; a connection idle in a
        proxy's pool is closed by the proxy at its idle timeout, which must be
        shorter than ours (deploy/nginx.conf). Closing it here instead would
        race with the proxy writing a request on it. What is still open after
        the keep-alive timeout would have been closed by uvicorn's keep-alive
        timer anyway; uvicorn's shutdown then closes it, and lets requests in
        flight finish.
        """
        self.drain.close_connections()
        began = time.monotonic()
        give_up = began + self.config.timeout_keep_alive + 1.0
        # Polled: uvicorn's protocols signal no event when a connection closes.
        while time.monotonic() < give_up and not self.force_exit and self._http_open():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        left = [p for p in self.server_state.connections if hasattr(p, "cycle")]
        if left:
            log.info("%d connections still open after the keep-alive timeout", len(left))
        else:
            log.info("clients closed every connection in %.2f s", time.monotonic() - began)

    async def serve_the_backlog(self) -> None:
        """Close the listeners without resetting the connections queued on them.

        Closing a listening socket resets every connection the kernel had
        accepted for it but the process had not yet: a request written into one
        is lost, and a proxy must not resend a POST (nginx answers it 502;
        tests/operations/test_compose_stack.py counts none). So uvloop's
        listener is closed first while a duplicate of its descriptor keeps the
        socket open; the queue is then emptied through the duplicate and each
        connection handed to uvicorn like any other, until accept() finds the
        queue empty, and the duplicate is closed in that same step: nothing
        runs in between that could let a connection queue.

        uvicorn's shutdown closes every connection that has not begun a
        request, although its client may have written one already:
        let_clients_close, next, waits for those to be answered too.
        """
        loop = asyncio.get_running_loop()
        duplicates: list[socket.socket] = []
        for server in self.servers:
            for listener in server.sockets:
                dup = socket.socket(fileno=os.dup(listener.fileno()))
                dup.setblocking(False)
                duplicates.append(dup)
        for server in self.servers:
            server.close()
        taken: list[Any] = []
        # Clients that keep connecting would keep this loop going: after a
        # second the duplicate is closed whatever is queued.
        give_up = time.monotonic() + 1.0
        try:
            while time.monotonic() < give_up:
                queued = []
                for dup in duplicates:
                    while True:
                        try:
                            queued.append(dup.accept()[0])
                        except (BlockingIOError, InterruptedError):
                            break
                if not queued:
                    break
                for conn in queued:
                    _, protocol = await loop.connect_accepted_socket(self._protocol, conn)
                    taken.append(protocol)
        finally:
            for dup in duplicates:
                dup.close()
        if taken:
            log.info("served %d connections queued at the listener's close", len(taken))

    def _http_open(self) -> bool:
        # HTTP protocols only: a websocket is closed (1012) by uvicorn's shutdown.
        return any(
            hasattr(p, "cycle") and not p.transport.is_closing()
            for p in self.server_state.connections
        )

    def _protocol(self) -> asyncio.Protocol:
        # What uvicorn's startup gives its listeners (a closure there).
        protocol: asyncio.Protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        return protocol
