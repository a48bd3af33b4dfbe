"""Blocking work off the event loop, in a thread that cannot hold up exit."""

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def in_daemon_thread(work: Callable[[], T]) -> T:
    """Run `work` in a daemon thread and await its result.

    Not asyncio.to_thread: its executor threads are joined at exit, and an NVML
    call on a wedged GPU can block for minutes, which would turn "stop within
    a second" into "stop when the driver feels like it".
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return  # the waiter was cancelled
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, error = work(), None
        except BaseException as e:
            result, error = None, e
        # RuntimeError: the loop closed while we worked, and nobody is waiting.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="llmgw-agent-survey", daemon=True).start()
    return await future
