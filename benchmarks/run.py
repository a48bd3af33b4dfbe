"""Run the benchmark suite: `python -m benchmarks [--quick] [--sizes 1000,10000,100000]`.

Builds a synthetic cluster per size on its own PostgreSQL (embedded in a temp
dir, or a fresh database on BENCH_DATABASE_URL), starts `llmgw-inventory serve`
processes on it, measures every figure against a baseline taken in the same
run, prints a table and writes it as Markdown. Exits non-zero only when a result
is wrong (double booking, an unchanged report rewritten, nothing answered),
never because a number is slow: CI runs `--quick` as a smoke test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks import cluster
from benchmarks.bench import Bench
from benchmarks.database import (
    create_database,
    drop_database,
    migrate,
    postgres_server,
    server_version,
)
from benchmarks.results import (
    FIGURES_PAGE,
    Results,
    ResultsPageError,
    check_results_page,
    figures_page,
    results_section,
    write_results_page,
)
from benchmarks.services import services

REPO = Path(__file__).resolve().parent.parent
SECTIONS = (
    "questions", "registration", "heartbeats", "allocation", "layers", "statements", "churn",
    "peer", "floor", "real_cluster", "fit", "groups", "read_replicas", "taints", "tenancy",
    "preemption", "routes", "reservations",
)  # fmt: skip


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )


def commit() -> str:
    """The checkout's commit, marked -dirty when tracked files differ from it."""
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head}-dirty" if git("status", "--porcelain", "--untracked-files=no") else head


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


async def run_size(server_url: str, size: int, args: argparse.Namespace, results: Results) -> int:
    """Measure one cluster size; returns the number of wrong results."""
    from benchmarks import (
        allocation,
        churn,
        fit,
        floor,
        groups,
        layers,
        peer,
        preemption,
        questions,
        read_replicas,
        real_cluster,
        reservations,
        routes,
        statements,
        taints,
        tenancy,
        writes,
    )

    wrong = 0
    url = await create_database(server_url)
    try:
        await asyncio.to_thread(migrate, url)
        import asyncpg

        start = time.perf_counter()
        conn = await asyncpg.connect(url)
        try:
            await cluster.load(conn, size)
        finally:
            await conn.close()
        results.note(
            f"{size:,} nodes: cluster loaded in {time.perf_counter() - start:.1f} s "
            f"(PostgreSQL {await server_version(url)})"
        )
        sections = set(args.only.split(",")) if args.only else set(SECTIONS)
        sections -= set(args.skip.split(",")) if args.skip else set()
        with services(url, args.services) as procs:
            bench = await Bench.on(url, size, procs, results, args)
            # The quick run asks for a smaller page: a smoke test, not a figure.
            qs = questions.questions(size, 200 if args.quick else questions.PAGE_SIZE)
            counts: dict[str, str] = {}
            if "statements" in sections:
                plans: list[str] = []
                counts = await statements.count_statements(url, qs, bench.versions, plans)
                for plan in plans:
                    results.note(f"{size:,} nodes: {plan}")
            if "questions" in sections:
                for q in qs:
                    print(f"[{size}] {q.name}", flush=True)
                    await questions.measure_question(bench, q, counts.get(q.name, ""))
                print(f"[{size}] freeGpus full answer", flush=True)
                wrong += await questions.measure_full_answer(
                    bench, 200 if args.quick else questions.PAGE_SIZE
                )
            # Before the sections that write: every round's place must find the
            # cluster as loaded (an allocation run can leave no H100 free).
            if "fit" in sections:
                print(f"[{size}] fit against place (issue 31)", flush=True)
                await fit.measure_fit(bench)
            if "groups" in sections:
                print(f"[{size}] placeGroup and fitGroup against place (issue 39)", flush=True)
                await groups.measure_groups(bench)
            if "taints" in sections:
                print(f"[{size}] place and freeGpus with 1% of GPUs tainted (issue 38)", flush=True)
                await taints.measure_taints(bench)
            if "tenancy" in sections:
                print(f"[{size}] place with a tenant's quota in force (issue 46)", flush=True)
                await tenancy.measure_tenancy(bench)
            if "preemption" in sections:
                print(
                    f"[{size}] a place that must preempt, and one on free GPUs (issue 46)",
                    flush=True,
                )
                await preemption.measure_preemption(bench)
            if "reservations" in sections:
                print(f"[{size}] place and fit(at:) with reservations (issue 47)", flush=True)
                await reservations.measure_reservations(bench)
            if "registration" in sections:
                print(f"[{size}] registration", flush=True)
                await writes.measure_registration(bench, counts)
            if "heartbeats" in sections:
                print(f"[{size}] heartbeats", flush=True)
                await writes.measure_heartbeats(bench, counts.get("heartbeat", ""))
            if "churn" in sections:
                print(f"[{size}] churn", flush=True)
                wrong += await churn.measure_churn(bench, args.churn_seconds)
            if "allocation" in sections:
                print(f"[{size}] allocation", flush=True)
                wrong += await allocation.measure_allocation(bench, counts)
            if "layers" in sections:
                print(f"[{size}] layers (domain calls in-process)", flush=True)
                wrong += await layers.measure_layers(bench)
            if "floor" in sections:
                print(f"[{size}] one process against the bare Starlette floor", flush=True)
                await floor.measure_floor(bench)
            if "routes" in sections:
                print(f"[{size}] each fast-path route against Strawberry's view", flush=True)
                wrong += await routes.measure_routes(bench)
            if "read_replicas" in sections:
                # A loopback cluster of its own: a primary and two read replicas (issue 37).
                print(f"[{size}] freeGpus on read replicas", flush=True)
                wrong += await read_replicas.measure_read_replicas(bench, args.services)
            if "real_cluster" in sections:
                # Databases of its own, loaded through the API (issue 30).
                wrong += await real_cluster.measure_real_cluster(
                    server_url, size, args, results, 200 if args.quick else questions.PAGE_SIZE
                )
            if "peer" in sections and size == min(args.sizes):
                print(f"[{size}] PostGraphile peer", flush=True)
                await peer.measure_peer(bench, args.peer_timeout)
    finally:
        await drop_database(server_url, url)
    return wrong


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a ~1-minute smoke run (1k nodes)")
    parser.add_argument("--sizes", help="cluster sizes, e.g. 1000,10000,100000")
    parser.add_argument("--rounds", type=int, help="rounds per figure")
    parser.add_argument("--seconds", type=float, help="seconds per throughput round")
    parser.add_argument("--calls", type=int, help="calls per latency round")
    parser.add_argument("--churn-seconds", type=float, help="seconds of each churn burst")
    parser.add_argument("--services", type=int, default=2, help="service processes")
    parser.add_argument("--only", help=f"comma-separated sections of {', '.join(SECTIONS)}")
    parser.add_argument("--skip", help="comma-separated sections to leave out")
    parser.add_argument(
        "--peer-timeout", type=float, default=240, help="seconds to wait for PostGraphile"
    )
    parser.add_argument(
        "--real-cluster-layouts",
        type=int,
        help="how many of real_cluster.LAYOUTS to load (default: 1 with --quick, else all)",
    )
    parser.add_argument(
        "--markdown", default="/tmp/llmgw-benchmarks.md", help="where to write the table"
    )
    parser.add_argument(
        "--write-results",
        metavar="PAGE",
        help="replace the current results in PAGE (BENCHMARKS.md): the commit, machine, date, "
        "every target with its status, every figure",
    )
    args = parser.parse_args(argv)
    if args.write_results:
        try:
            check_results_page(Path(args.write_results).read_text(), args.write_results)
        except OSError as error:
            parser.error(f"--write-results {args.write_results}: {error.strerror}")
        except ResultsPageError as error:
            parser.error(f"--write-results: {error}")
    quick = args.quick
    args.sizes = [int(s) for s in (args.sizes or ("1000" if quick else "1000,10000")).split(",")]
    args.rounds = args.rounds or (2 if quick else 3)
    args.seconds = args.seconds or (0.7 if quick else 2.0)
    args.calls = args.calls or (12 if quick else 100)
    args.churn_seconds = args.churn_seconds or (2.0 if quick else 20.0)
    if quick and not args.skip and not args.only:
        args.skip = "peer"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # Read before the run: the figures are of the code as it was when they started.
    measured_commit = commit()
    results = Results()
    started = time.perf_counter()
    results.note(f"machine: {machine()}; load average at start {load_average()}")
    command = " ".join(["python -m benchmarks", *(argv if argv is not None else sys.argv[1:])])
    wrong = 0
    with postgres_server() as (server_url, which):
        results.note(f"database: {which}; {args.services} service processes")
        for size in args.sizes:
            print(f"== {size:,} nodes", flush=True)
            runner = _runner()
            wrong += runner(run_size(server_url, size, args, results))
    results.note(
        f"load average at end {load_average()}; took {time.perf_counter() - started:.0f} s"
    )
    table = results.markdown()
    print()
    print(table)
    Path(args.markdown).write_text(f"Command: `{command}`\n\n{table}")
    print(f"written to {args.markdown}")
    if args.write_results:
        page = Path(args.write_results)
        run = {
            "command": command,
            "commit": measured_commit,
            "machine": f"{machine()}, shared with other work (load averages in the notes)",
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        section = results_section(results, **run)
        page.write_text(write_results_page(page.read_text(), section, str(page)))
        figures = page.parent / FIGURES_PAGE
        figures.parent.mkdir(parents=True, exist_ok=True)
        figures.write_text(figures_page(results, **run))
        print(f"current results written into {page}, every figure into {figures}")
    if wrong:
        print(f"{wrong} wrong results (see above)", file=sys.stderr)
        return 1
    return 0


def _runner():  # type: ignore[no-untyped-def]
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run
