"""`python -m benchmarks.equivalence [--operations 5000] [--seed N]`: the long differential run.

Prints every difference (the operation, both answers) and a summary; exits 1
when there was any. Without --seed the draw is random (a fresh exploration);
with it, reproducible.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time

from benchmarks.database import create_database, drop_database, migrate, postgres_server
from benchmarks.equivalence import Exploration, explore
from benchmarks.equivalence.differential import Differential


async def fast_path_counts(differential: Differential) -> dict[str, float]:
    """The fast app's route counters, as its /metrics shows them: how many of the
    generated operations a fast route answered or declined, and why."""
    response = await differential.fast.get(
        "/metrics", headers={"Authorization": f"Bearer {differential.secrets['operator']}"}
    )
    counts: dict[str, float] = {}
    for line in response.text.splitlines():
        if line.startswith("inventory_fast_path_requests_total{"):
            series, _, value = line.rpartition(" ")
            counts[series.removeprefix("inventory_fast_path_requests_total")] = float(value)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.equivalence", description=__doc__)
    parser.add_argument("--operations", type=int, default=2000)
    parser.add_argument("--seed", type=int, help="hypothesis seed (default: a random one)")
    args = parser.parse_args(argv)
    # Both apps log every error they answer (as the service does); here only the
    # comparison speaks.
    logging.disable(logging.ERROR)
    chosen = args.seed if args.seed is not None else random.randrange(2**32)
    started = time.perf_counter()

    shown = 0

    def progress(found: Exploration) -> None:
        nonlocal shown
        for difference in found.differences[shown:]:
            print("\n" + difference.describe() + "\n", flush=True)
        shown = len(found.differences)
        if found.operations % 250 == 0:
            print(
                f"{found.operations} operations, {len(found.differences)} differences, "
                f"{time.perf_counter() - started:.0f} s",
                flush=True,
            )

    loop = asyncio.new_event_loop()
    with postgres_server() as (server_url, _which):
        url = loop.run_until_complete(create_database(server_url))
        try:
            migrate(url)
            differential = loop.run_until_complete(Differential.start(url))
            try:
                before = loop.run_until_complete(fast_path_counts(differential))
                found = explore(loop, differential, args.operations, chosen, progress)
                after = loop.run_until_complete(fast_path_counts(differential))
            finally:
                loop.run_until_complete(differential.close())
        finally:
            loop.run_until_complete(drop_database(server_url, url))
    loop.close()
    print(
        f"\nseed {chosen}: {found.operations} operations in {time.perf_counter() - started:.0f} s"
    )
    print("reference answers: " + ", ".join(f"{k} {v}" for k, v in found.outcomes.most_common()))
    print("features: " + ", ".join(f"{k} {v}" for k, v in found.features.most_common()))
    print("reference's errors: " + "; ".join(f"{k!r} {v}" for k, v in found.errors.most_common(25)))
    print("the fast app's routes (/metrics, inventory_fast_path_requests_total):")
    for series, count in sorted(after.items()):
        if count - before.get(series, 0):
            print(f"  {series} {count - before.get(series, 0):g}")
    print(f"{len(found.differences)} differences")
    return 1 if found.differences else 0


if __name__ == "__main__":
    sys.exit(main())
