"""SIGTERM: leave the load balancer first, then stop, so that no request in flight fails.

Measured through nginx in front of two replicas: a replica that simply
stopped (uvicorn's default: close the listener and every idle keep-alive
connection at once) stalled requests for up to 38.7 s, and a POST that nginx
had already written to a closing keep-alive connection cannot be retried
safely. So on the first SIGTERM (`docker stop`, systemd, Kubernetes):

1. drain, for INVENTORY_SHUTDOWN_DRAIN seconds: /readyz answers 503
   "shutting down" (a load balancer that polls it stops sending), and every
   response carries `Connection: close`, so proxies drop their keep-alive
   connections to this process after their current request instead of
   racing its shutdown; requests are still served;
2. then uvicorn's own shutdown: stop accepting, let in-flight requests finish
   (at most INVENTORY_REQUEST_TIMEOUT more), close websockets with 1012
   ("service restart": clients reconnect, to another replica), then the
   lifespan stops the background tasks and the pools.

A second SIGTERM, or Ctrl-C, skips what is left of the drain.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


class CloseConnectionsWhileDraining:
    """Adds `Connection: close` to every HTTP response once the drain began."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.drain.draining:
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() != b"connection"
                ]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)


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
