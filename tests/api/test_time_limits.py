"""Requests' time limits kept by one watchdog: they fire as asyncio.timeout would, and only then."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.web.time_limits import TimeLimits
from tests.support.waiting import until


async def test_a_request_past_its_limit_is_stopped_within_one_tick() -> None:
    limits = TimeLimits(0.2)
    started = time.monotonic()
    with pytest.raises(TimeoutError), limits.begin():
        await asyncio.sleep(5)
    took = time.monotonic() - started
    assert 0.2 <= took < 0.2 + limits.tick + 0.15
    assert limits.running == {}


async def test_requests_that_finish_in_time_are_left_alone_and_the_watchdog_stops() -> None:
    limits = TimeLimits(0.2)

    async def quick() -> str:
        with limits.begin():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # past the limit, outside it
        return "answered"

    assert await asyncio.gather(*(quick() for _ in range(20))) == ["answered"] * 20
    assert limits.running == {}

    async def watchdog_stopped() -> bool:
        return limits._watchdog is None

    # Nothing left armed on an idle process.
    await until(watchdog_stopped, "the idle watchdog to stop")


async def test_a_limit_ended_when_its_answer_started_no_longer_fires() -> None:
    limits = TimeLimits(0.1)
    with limits.begin() as limit:
        limit.end()  # what the response's start does (web/exchange.py)
        await asyncio.sleep(0.3)  # a streamed answer, longer than the limit
    assert not limit.expired


async def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    limits = TimeLimits(5)

    async def request() -> None:
        with limits.begin():
            await asyncio.sleep(5)

    task = asyncio.create_task(request())

    async def begun() -> bool:
        return bool(limits.running)

    await until(begun, "the request's limit to begin")
    task.cancel()  # a server's shutdown, say
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limits.running == {}
