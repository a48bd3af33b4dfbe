"""SIGTERM: leave the load balancer first, then stop, so that no request in flight fails.

Measured through nginx in front of two replicas: a replica that simply
stopped (uvicorn's default: close the listener and every idle keep-alive
connection at once) stalled requests for up to 38.7 s, and a POST that nginx
had already written to a closing keep-alive connection cannot be retried
safely. So on the first SIGTERM (`docker stop`, systemd, Kubernetes):

1. drain, for INVENTORY_SHUTDOWN_DRAIN seconds: /readyz answers 503
   "shutting down" (a load balancer that polls it stops sending), and every
   response carries `Connection: close` (web/exchange.py), so proxies drop their keep-alive
   connections to this process after their current request instead of
   racing its shutdown; requests are still served;
2. then stop accepting without dropping what the kernel already queued
   (serve_the_backlog), and uvicorn's own shutdown: let in-flight requests finish
   (at most INVENTORY_REQUEST_TIMEOUT more), close websockets with 1012
   ("service restart": clients reconnect, to another replica), then the
   lifespan stops the background tasks and the pools.

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
    """Whether this process is leaving the load balancer."""

    def __init__(self) -> None:
        self.since: float | None = None

    @property
    def draining(self) -> bool:
        return self.since is not None

    def begin(self) -> None:
        if self.since is None:
            self.since = time.monotonic()


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
                "SIGTERM: draining for %g s (/readyz 503, Connection: close), then stopping",
                self.drain_seconds,
            )
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            log.info("drained: no longer accepting; finishing requests in flight")
            return True
        return False

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.serve_the_backlog()
        await super().shutdown(sockets)

    async def serve_the_backlog(self, settle: float = 2.0) -> None:
        """Close the listeners without resetting the connections queued on them.

        Closing a listening socket resets every connection the kernel had
        accepted for it but the process had not yet: a request written into one
        is lost, and a proxy must not resend a POST (measured: about one
        request in 3,000 through nginx at a replica's stop). So uvloop's
        listener is closed first while a duplicate of its descriptor keeps the
        socket open; the queue is then emptied through the duplicate and each
        connection handed to uvicorn like any other, until accept() finds the
        queue empty, and the duplicate is closed in that same step: nothing
        runs in between that could let a connection queue.

        uvicorn's shutdown closes every connection that has not begun a
        request, although its client may have written one already: so every
        connection without a request yet (taken here, or by uvloop just before)
        is given up to `settle` seconds to have it read first.
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
        deadline = time.monotonic() + settle
        # Polled: uvicorn's protocols signal no event when a request begins.
        while time.monotonic() < deadline and any(  # noqa: ASYNC110
            # HTTP protocols only: a websocket's has no request cycle.
            hasattr(p, "cycle") and p.cycle is None and not p.transport.is_closing()
            for p in self.server_state.connections
        ):
            await asyncio.sleep(0.01)

    def _protocol(self) -> asyncio.Protocol:
        # What uvicorn's startup gives its listeners (a closure there).
        protocol: asyncio.Protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        return protocol
