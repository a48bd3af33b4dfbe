"""What every service process runs beside the API: the liveness sweep, the timeline (changes on time), the event stream, /metrics, /readyz.

Kept out of app.py so the application module stays a list of routes; the app
starts Background in its lifespan and mounts operational_routes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service import metrics, readiness
from service.config import Settings
from service.database import connections, read_routing
from service.database.db_faults import RETRY_AFTER_SECONDS
from service.event_log.event_stream import EventStream
from service.fleet import maintenance
from service.fleet.liveness import run_sweeper
from service.scheduling import reservations
from service.scheduling.timeline import run_timeline
from service.tasks import stop_task
from service.web.draining import Drain

log = logging.getLogger(__name__)


# The changes on time every process makes (service/scheduling/timeline/):
# reservations' one by one, maintenance windows' in a round of their own.
TIMELINE = (*reservations.TRANSITIONS,)
SWEEPS = (maintenance.SWEEP,)


class Background:
    """The process's sweeper and timeline tasks and event stream, started and stopped with the app."""

    def __init__(
        self,
        sweeper: asyncio.Task[None] | None,
        stream: EventStream,
        timeline: asyncio.Task[None] | None = None,
    ) -> None:
        self.sweeper = sweeper
        self.stream = stream
        self.timeline = timeline

    @classmethod
    async def start(
        cls,
        app: Any,
        engine: AsyncEngine,
        settings: Settings,
        *,
        sweep: bool = True,
    ) -> Background:
        # The LISTEN connection is a plain asyncpg connection outside the
        # pool: it is held for the process's life and must not count against
        # the connections requests use.
        # The read replicas' probe, so that one unreachable at start is said at start.
        read_routing.start(engine)
        dsn = connections.dsn_of(engine)
        stream = EventStream(dsn, engine, connect_timeout=settings.db_timeout)
        stream.start()
        app.state.event_stream = stream
        # Serve only once subscribers can be served: a subscription accepted
        # before the LISTEN is up would silently miss the first events. A
        # database that is down does not block startup; the stream retries.
        if not await stream.wait_listening(within=settings.db_timeout):
            log.warning("event stream not listening yet; subscriptions start when it is")
        sweeper = None
        if sweep:
            sweeper = asyncio.create_task(
                run_sweeper(
                    engine,
                    unreachable_after=settings.unreachable_after,
                    lost_after=settings.lost_after,
                    interval=settings.sweep_interval,
                    event_retention=settings.event_retention,
                    lost_policy=settings.lost_policy,
                ),
                name="liveness-sweep",
            )
        timeline = None
        if sweep:
            timeline = asyncio.create_task(
                run_timeline(engine, TIMELINE, sweeps=SWEEPS, interval=settings.timeline_interval),
                name="timeline",
            )
        return cls(sweeper, stream, timeline)

    async def stop(self) -> None:
        await stop_task(self.timeline)
        await stop_task(self.sweeper)
        await self.stream.stop()


def operational_routes(
    engine: Callable[[], AsyncEngine], settings: Settings, drain: Drain
) -> list[Route]:
    async def metrics_endpoint(request: Request) -> Response:
        try:
            async with (
                asyncio.timeout(settings.db_timeout),
                connections.autocommit(engine()) as conn,
            ):
                body = await metrics.render(conn)
        except Exception as error:
            log.warning("metrics without the cluster's state: %s", error)
            body = await metrics.render(None)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    async def readyz(request: Request) -> Response:
        if drain.draining:
            # Leaving the load balancer (SIGTERM): still serving, not for long.
            state = readiness.Readiness(False, "shutting down", None, readiness.expected_revision())
        else:
            state = await readiness.check(engine(), settings.db_timeout)
        body: dict[str, Any] = {
            "status": "ready" if state.ready else "not ready",
            "reason": state.reason,
            "revision": state.revision,
            "expected": state.expected,
        }
        if state.backup is not None:
            # Details only: backup trouble never makes the process unready
            # (service/backup_status.py says why).
            body["backup"] = state.backup
        if state.ready:
            return JSONResponse(body)
        # Not ready passes (the database comes back, a drained replica is replaced).
        return JSONResponse(body, 503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    return [Route("/metrics", metrics_endpoint), Route("/readyz", readyz)]
