"""PostGraphile 5 as an optional peer on the same tables."""

from __future__ import annotations

from benchmarks.bench import Bench


async def measure_peer(bench: Bench, wait_seconds: float) -> None:
    bench.results.note("PostGraphile peer: not written yet")
