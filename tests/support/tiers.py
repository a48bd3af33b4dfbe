"""The test tiers: what marks a test as more than in-process, and the guard that makes marking stick.

`python3 dev.py test --fast` runs the in-process tier: the tests with none of
OUTSIDE's markers. A test that starts a process, a container or a browser, or
that builds a page-cost cluster, carries its marker (docs/contributing/development.md).
Marking is enforced, not remembered:
- fixtures that start such things mark every test that uses them
  (FIXTURE_MARKERS), at collection, so `-m` selects them;
- while a test runs (setup, call, teardown), starting a process goes through
  `guard`: a test without the marker its process needs fails, naming the
  command and the marker to add. A process started in an unmarked test would
  otherwise sit in the fast tier, slowing it, until someone noticed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

# marker -> what it says, as `pytest --markers` lists it.
MARKERS = {
    "process": "starts processes: the service, an agent, a CLI, a PostgreSQL server of its own, npm",
    "docker": "starts containers (Docker, docker-compose); runs in one worker (xdist_group docker)",
    "browser": "starts a browser (headless Chromium)",
    "page_costs": "explains statements on a page-cost cluster (built once per session, cloned per case)",
    "serial": "must not share the machine with another heavy test (timing-sensitive faults); runs in one worker",
}
# The markers that take a test out of the in-process tier (`pytest --fast`, tests/conftest.py).
OUTSIDE = ("process", "docker", "browser", "page_costs")

# Fixtures that start processes: a test that uses one is marked `process`.
FIXTURE_MARKERS = {
    "live_service": "process",
    "live_service_factory": "process",
    "service_url": "process",
    "own_postgres": "process",
    "page_cost_templates": "page_costs",
}

# Tests that run in one xdist worker, one after another (pytest-xdist's
# --dist loadgroup): Docker stacks share dockerd, its networks and the
# machine's memory; `serial` ones time faults and would misjudge a stall
# caused by a neighbour.
GROUPS = {"docker": "docker", "serial": "serial"}


def needed_marker(argv: Sequence[str]) -> str:
    """The marker a test needs to start this command."""
    program = Path(str(argv[0])).name if argv else ""
    if program in ("docker", "docker-compose", "dockerd"):
        return "docker"
    if program.startswith("chromium") or program in ("chrome", "google-chrome"):
        return "browser"
    return "process"


def allowed(marks: set[str], needed: str) -> bool:
    # A browser or Docker test also starts the service or a CLI beside it.
    return needed in marks or (needed == "process" and bool(marks & {"docker", "browser"}))


class _Guard:
    """Who may start processes now: the running test's markers, or infrastructure."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.item: pytest.Item | None = None
        self.marks: set[str] = set()
        self.infrastructure = 0
        self.violations: list[str] = []

    def check(self, argv: Sequence[str]) -> None:
        with self.lock:
            if self.item is None or self.infrastructure:
                return
            needed = needed_marker(argv)
            if allowed(self.marks, needed):
                return
            message = (
                f"{self.item.nodeid} started `{' '.join(map(str, argv))[:200]!r}` without"
                f" @pytest.mark.{needed}: mark the test (or its module's pytestmark) so that"
                " `dev.py test --fast` leaves it out (docs/contributing/development.md, Tiers)"
            )
            self.violations.append(message)
        raise ProcessNotMarked(message)


class ProcessNotMarked(AssertionError):
    pass


GUARD = _Guard()


@contextlib.contextmanager
def infrastructure() -> Iterator[None]:
    """Processes the run itself needs (the shared PostgreSQL server), started for no one test."""
    with GUARD.lock:
        GUARD.infrastructure += 1
    try:
        yield
    finally:
        with GUARD.lock:
            GUARD.infrastructure -= 1


@contextlib.contextmanager
def running(item: pytest.Item) -> Iterator[None]:
    with GUARD.lock:
        GUARD.item = item
        GUARD.marks = {m.name for m in item.iter_markers()}
    try:
        yield
    finally:
        with GUARD.lock:
            GUARD.item = None
            GUARD.marks = set()


def take_violations() -> list[str]:
    with GUARD.lock:
        found, GUARD.violations = GUARD.violations, []
    return found


def _argv_of(args: Any) -> list[str]:
    if isinstance(args, (str, bytes, os.PathLike)):
        return [os.fsdecode(args)]
    return [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]


def install() -> None:
    """Route every way this interpreter starts a process through GUARD.

    subprocess (and asyncio's subprocesses, built on it) starts children in
    Popen._execute_child; os.fork and os.posix_spawn are the other doors.
    """
    execute_child: Callable[..., Any] = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def guarded_execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any) -> Any:
        GUARD.check(_argv_of(args))
        return execute_child(self, args, *rest)

    subprocess.Popen._execute_child = guarded_execute_child  # type: ignore[attr-defined]

    fork = os.fork

    def guarded_fork() -> int:
        GUARD.check(["fork"])
        return fork()

    os.fork = guarded_fork
    for name in ("posix_spawn", "posix_spawnp"):
        spawn = getattr(os, name, None)
        if spawn is None:
            continue

        def guarded_spawn(path: Any, argv: Any, *rest: Any, _spawn: Any = spawn, **kw: Any) -> Any:
            GUARD.check(_argv_of(argv))
            return _spawn(path, argv, *rest, **kw)

        setattr(os, name, guarded_spawn)


def group_for_xdist(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Suffix each grouped test's nodeid with its xdist_group, as --dist loadgroup reads it.

    pytest-xdist 3.8 does this by assigning `item._nodeid`, which pytest 9.2's
    nodes no longer read (their nodeid is `str(item._id)`): every group was
    silently spread over the workers, and a page-cost cluster was built by
    each worker that got one of its cases. So it is done here too, after
    xdist's own hook and after mark_collected added the groups of markers.
    """
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        if not names or "@" in item.nodeid:
            continue
        suffixed = f"{item.nodeid}@{'_'.join(sorted(names))}"
        if hasattr(item, "_id"):
            item._id = coerce_node_id(suffixed)
        else:
            item._nodeid = suffixed
        assert item.nodeid == suffixed, "pytest changed how a node's id is kept"


def mark_collected(items: list[pytest.Item]) -> None:
    """Markers from the fixtures a test uses, and the xdist group of its marker."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in names and not item.get_closest_marker(marker):
                item.add_marker(marker)
        for marker, group in GROUPS.items():
            if item.get_closest_marker(marker) and not item.get_closest_marker("xdist_group"):
                item.add_marker(pytest.mark.xdist_group(group))
