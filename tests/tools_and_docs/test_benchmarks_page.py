"""BENCHMARKS.md is a results page: its current table is what `python -m benchmarks` wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.measure import Figure
from benchmarks.results import (
    FIGURES_PAGE,
    MET,
    NOT_MEASURED,
    NOT_MET,
    PER_SIZE,
    RESULTS_END,
    RESULTS_START,
    ROUTE_ROW,
    Results,
    ResultsPageError,
    Row,
    figures_page,
    results_section,
    verdicts,
    write_results_page,
)

REPO = Path(__file__).resolve().parents[2]
PAGE = (REPO / "BENCHMARKS.md").read_text()


def figure(*values: float) -> Figure:
    f = Figure()
    for value in values:
        f.add(value)
    return f


def quick_rows() -> list[Row]:
    return [
        Row(1000, "heartbeat, 64 agents", "req/s", figure(6000, 6100), "raw", figure(9000)),
        Row(1000, "registerNode, changed report", "req/s", figure(900), "raw", figure(3000)),
    ]


def test_every_target_is_listed_met_not_met_or_not_measured() -> None:
    judged = {v.target: v for v in verdicts(quick_rows())}
    assert judged["1,000 nodes: heartbeats >= 5,000/s"].status == MET
    assert judged["1,000 nodes: registration >= 0.5x raw asyncpg"].status == NOT_MET
    assert judged["1,000 nodes: registration >= 0.5x raw asyncpg"].figures == "x0.30"
    # A target this run did not measure is still listed, saying why.
    assert judged["place >= 1,500 claims/s"].status == NOT_MEASURED
    assert "allocation section did not run" in judged["place >= 1,500 claims/s"].figures
    assert judged["freeGpus p50 at 100k nodes <= 2x at 1k"].status == NOT_MEASURED
    names = {name for name, _, _ in PER_SIZE}
    assert all(any(t.endswith(name) for t in judged) for name in names)


def test_the_results_replace_only_the_marked_section() -> None:
    results = Results(rows=quick_rows(), notes=["machine: 2 cores"])
    section = results_section(
        results, command="python -m benchmarks --quick", commit="abc1234", machine="2 cores",
        when="2026-12-05 09:00 UTC",
    )  # fmt: skip
    page = f"# B\n\nbefore\n\n{RESULTS_START} old -->\nold table\n{RESULTS_END}\n\nafter\n"
    written = write_results_page(page, section, "B.md")
    assert written.startswith("# B\n\nbefore\n\n" + RESULTS_START)
    assert written.endswith(RESULTS_END + "\n\nafter\n")
    assert "old table" not in written
    assert "**Commit** `abc1234`, **date** 2026-12-05 09:00 UTC, **machine** 2 cores." in written
    assert "| 1,000 nodes: heartbeats >= 5,000/s | met | 6,050/s |" in written
    assert "- machine: 2 cores" in written
    assert f"[{FIGURES_PAGE}]({FIGURES_PAGE})" in written
    # Every figure is on its own page, written by the same run.
    figures = figures_page(
        results, command="python -m benchmarks --quick", commit="abc1234", machine="2 cores",
        when="2026-12-05 09:00 UTC",
    )  # fmt: skip
    assert figures.startswith("# Benchmark figures\n")
    assert "**Commit** `abc1234`" in figures
    assert sum(line.startswith("| 1,000 |") for line in figures.splitlines()) == len(results.rows)
    # Written twice, the page is the same: the markers survive.
    assert write_results_page(written, section, "B.md") == written


@pytest.mark.process
def test_a_page_without_markers_is_refused_before_the_run() -> None:
    with pytest.raises(ResultsPageError, match=r"NOTES\.md has no"):
        write_results_page("# notes\n", "", "NOTES.md")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--write-results", "README.md"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--write-results: README.md has no '<!-- results:start" in done.stderr


def test_benchmarks_md_is_a_results_page_of_at_most_200_lines() -> None:
    assert len(PAGE.splitlines()) <= 200
    current = PAGE[PAGE.index(RESULTS_START) : PAGE.index(RESULTS_END)]
    assert (
        "written by `python -m benchmarks" in current and "--write-results BENCHMARKS.md" in current
    )
    assert "**Commit** `" in current and "**machine** " in current
    # Every target is in the table, with its status.
    rows = [line for line in current.splitlines() if line.startswith("| ")]
    for name, _, _ in PER_SIZE:
        assert any(name in row for row in rows), name
    assert (REPO / "docs" / "history" / "benchmarks-journal.md").exists()
    # The figures page the results link to was written by the same run.
    figures = (REPO / FIGURES_PAGE).read_text()
    assert current.split("**Commit** ")[1].split(",")[0] in figures


def test_a_fast_path_route_that_stops_paying_for_itself_is_not_met() -> None:
    """benchmarks/routes.py: each route's CPU per request against Strawberry's view's (issue 45)."""
    paying = Row(1000, f"{ROUTE_ROW}heartbeat route: the agents' beat", "ms CPU/request",
                 figure(0.13), "Strawberry's view", figure(1.1), better="lower")  # fmt: skip
    idle = Row(1000, f"{ROUTE_ROW}node route: one node", "ms CPU/request",
               figure(1.0), "Strawberry's view", figure(1.05), better="lower")  # fmt: skip
    judged = {v.target: v for v in verdicts([paying, idle])}
    route = "CPU per request <= 0.9x Strawberry's view's"
    assert judged[f"1,000 nodes: {paying.name}: {route}"].status == MET
    assert judged[f"1,000 nodes: {idle.name}: {route}"].status == NOT_MET
    unmeasured = {v.target: v for v in verdicts(quick_rows())}
    assert unmeasured[f"each fast-path route's {route}"].status == NOT_MEASURED
