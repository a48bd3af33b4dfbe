"""Waiting for a condition with a deadline: how tests order events, never by sleeping a guess.

A sleep long enough on a quiet machine is too short on two loaded cores, and
far too long everywhere else. These wait for the state the test needs (a row,
an event, a message) and fail naming it when it never comes; the deadline is
generous because it bounds a hang, it does not measure speed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# Seconds before a wait gives up: a bound on a hang, not a speed target.
PATIENCE = 30.0
# Seconds between two looks at the condition.
EVERY = 0.02


async def until(condition: Callable[[], Awaitable[T]], what: str, within: float = PATIENCE) -> T:
    """The condition's first truthy value; fails naming `what` (and the last value) at the deadline."""
    deadline = time.monotonic() + within
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {within}s; last: {value!r}")
        await asyncio.sleep(EVERY)


def until_sync(condition: Callable[[], T], what: str, within: float = PATIENCE) -> T:
    """until, for a test without an event loop (a subprocess, a CLI)."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {within}s; last: {value!r}")
        time.sleep(EVERY)
