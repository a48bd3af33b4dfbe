"""Churn: the scheduler question again after a burst of re-registrations at full rate.

An agent re-registers on every restart and reconnect, mostly with nothing
changed. Rewriting unchanged rows leaves dead tuples that slow every index scan
until vacuum; the digest skip and the IS DISTINCT FROM guards are what keep the
question's time flat. A burst of changed reports (disk free moved) shows what a
real change costs.
"""

from __future__ import annotations

from benchmarks.bench import Bench, close_all
from benchmarks.measure import Figure, throughput
from benchmarks.questions import free_gpus_p50, raw_free_gpus_p50
from benchmarks.results import Row
from benchmarks.writes import ReportSource, changed_reporter, unchanged_reporter

CHURN_NODES = 20_000
TABLES = ("nodes", "gpus", "gpu_pools", "filesystems", "fabric_attachments")


async def dead_tuples(bench: Bench) -> str:
    rows = await bench.sql(
        "SELECT relname, n_dead_tup, n_live_tup FROM pg_stat_user_tables"
        " WHERE relname = ANY($1::text[]) ORDER BY relname",
        list(TABLES),
    )
    return ", ".join(f"{r['relname']} {r['n_dead_tup']} dead/{r['n_live_tup']}" for r in rows)


async def report_changed_events(bench: Bench) -> int:
    rows = await bench.sql(
        "SELECT count(*) AS n FROM events WHERE kind IN ('report_changed', 'registered')"
    )
    return int(rows[0]["n"])


async def measure_churn(bench: Bench, seconds: float) -> int:
    """Returns 1 when an unchanged report was treated as changed (a wrong result)."""
    calls = max(20, bench.calls)
    agents = 16
    nodes = list(range(min(bench.size, CHURN_NODES)))
    source = ReportSource()

    async def p50s() -> tuple[Figure, Figure]:
        service, raw = Figure(), Figure()
        for _ in range(bench.rounds):
            service.add(await free_gpus_p50(bench, calls))
            raw.add(await raw_free_gpus_p50(bench, calls))
        return service, raw

    before, raw_before = await p50s()
    events_before = await report_changed_events(bench)

    async def burst(changed: bool) -> tuple[float, int]:
        clients = bench.connections(agents)
        make = changed_reporter if changed else unchanged_reporter

        def send_via(c):  # type: ignore[no-untyped-def]
            async def send(i: int, version: int) -> None:
                await c.graphql(source.body(i, version))

            return send

        workers = [make(bench, nodes[a::agents], send_via(c)) for a, c in enumerate(clients)]
        rate, failed = await throughput(workers, seconds)
        await close_all(clients)
        return rate, failed

    rate, failed = await burst(changed=False)
    rewritten = await report_changed_events(bench) - events_before
    after_same, _ = await p50s()
    dead_same = await dead_tuples(bench)
    rate_changed, failed_changed = await burst(changed=True)
    after_changed, raw_after_changed = await p50s()
    dead_changed = await dead_tuples(bench)

    add = bench.results.add
    add(Row(bench.size, "freeGpus p50 before churn", "ms", before, "raw SQL", raw_before,
            better="lower"))  # fmt: skip
    add(Row(bench.size, f"freeGpus p50 after {seconds:.0f} s of unchanged re-registration "
            f"({rate * seconds:,.0f} reports)", "ms", after_same, "before churn", before,
            note=f"target <= 1.2x; reports treated as changed or new: {rewritten} (must be 0); "
                 f"{failed} failed; dead tuples: {dead_same}",
            better="lower"))  # fmt: skip
    add(Row(bench.size, f"freeGpus p50 after {seconds:.0f} s of changed re-registration "
            f"({rate_changed * seconds:,.0f} reports)", "ms", after_changed, "before churn",
            before, note=f"{failed_changed} failed; dead tuples: {dead_changed}",
            better="lower"))  # fmt: skip
    add(Row(bench.size, "raw SQL freeGpus p50 after both bursts", "ms", raw_after_changed,
            "raw before churn", raw_before, better="lower"))  # fmt: skip
    if rewritten:
        bench.results.note(
            f"{bench.size} nodes: {rewritten} unchanged re-registrations were treated as changed"
        )
    return 1 if rewritten else 0
