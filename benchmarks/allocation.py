"""Allocation: `place` and `allocate` per second, 32 schedulers through two service processes."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench import Bench

SCHEMA = Path(__file__).resolve().parent.parent / "schema.graphql"


async def measure_allocation(bench: Bench) -> int:
    if "place(" not in SCHEMA.read_text():
        bench.results.note("allocation skipped: `place` is not in schema.graphql yet")
        return 0
    bench.results.note("allocation: not written yet")
    return 0
