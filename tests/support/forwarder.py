"""A TCP forwarder on loopback that can be pointed at another port: a load balancer in front of PostgreSQL.

What HAProxy (or a managed PostgreSQL's endpoint) does during a failover, in
the test's own event loop: connections opened before the switch stay with
the server they reached, new ones go to wherever it points now. Until its
health check notices, a real balancer keeps sending new connections to a
demoted primary; `point_at` is that check catching up.
"""

from __future__ import annotations

import asyncio
import contextlib


class Forwarder:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def point_at(self, port: int) -> None:
        """New connections go to `port` from now on."""
        self.target_port = port

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        for source, sink in ((client_r, server_w), (server_r, client_w)):
            task = asyncio.create_task(_pump(source, sink, (client_w, server_w)))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pumps):
            task.cancel()
        for task in list(self._pumps):
            with contextlib.suppress(BaseException):
                await task


async def _pump(
    source: asyncio.StreamReader,
    sink: asyncio.StreamWriter,
    both: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
) -> None:
    """Copy one direction until it ends; then end both (a server gone drops its client)."""
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        for writer in both:
            writer.close()
