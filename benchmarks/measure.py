"""Timing: rounds, medians with their spread, latency percentiles, throughput."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class Figure:
    """One measured quantity over several rounds: median, min and max."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def low(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def high(self) -> float:
        return max(self.values) if self.values else float("nan")


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


async def latencies(call: Callable[[], Awaitable[object]], count: int) -> list[float]:
    """Seconds per call, one caller, back to back."""
    out = []
    for _ in range(count):
        start = time.perf_counter()
        await call()
        out.append(time.perf_counter() - start)
    return out


class Exhausted(Exception):
    """A worker found nothing left to consume (no free GPU): the round ends there.

    Without it, a round that outlasts the cluster's free GPUs goes on counting
    calls that answer "no room", and the rate becomes the free GPUs divided by
    the round's length (at 1k nodes the raw claim baseline read 1,167/s in
    every run that way).
    """


async def throughput(
    workers: list[Callable[[], Awaitable[int]]], seconds: float
) -> tuple[float, int]:
    """Operations per second with one task per worker, each calling until time is up.

    A worker returns how many operations its call did (a batch may do many),
    or raises Exhausted to end the round for every worker; the rate is then
    over the time until the last call in flight returned.
    Returns the rate and the number of failures (exceptions) seen.
    """
    done = 0
    failures = 0
    exhausted = False
    deadline = time.perf_counter() + seconds

    async def loop(worker: Callable[[], Awaitable[int]]) -> None:
        nonlocal done, failures, exhausted
        while not exhausted and time.perf_counter() < deadline:
            try:
                # Awaited first: `done += await ...` reads `done` before the
                # await and loses every other task's increments meanwhile.
                count = await worker()
                done += count
            except Exhausted:
                exhausted = True
            except Exception:
                failures += 1
                if failures > 1000:
                    raise

    start = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in workers))
    return done / (time.perf_counter() - start), failures
