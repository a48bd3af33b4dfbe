"""A process's background tasks (event stream, liveness sweep, token watch): how one stops."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` and wait until it has run its cleanup, so shutdown leaves nothing running."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
