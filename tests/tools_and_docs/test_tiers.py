"""The tiers hold: a test that starts a process without its marker fails, and fixtures mark their tests.

`python3 dev.py test --fast` leaves out the tests marked process, docker,
browser or page_costs (tests/support/tiers.py). A test that starts a process
unmarked would sit in the fast tier, slowing it, until someone noticed; so the
guard fails it, naming the command and the marker to add.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tests.support import tiers


def test_starting_a_process_unmarked_fails_naming_the_marker() -> None:
    with pytest.raises(tiers.ProcessNotMarked, match=r"without @pytest.mark.process"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    # Recorded too, so a test whose code swallowed the error still fails: taken
    # here, or this test would fail for it.
    (violation,) = tiers.take_violations()
    assert "test_starting_a_process_unmarked_fails_naming_the_marker" in violation


@pytest.mark.process
def test_a_marked_test_may_start_processes() -> None:
    done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True)
    assert done.stdout == "ran\n"
    assert tiers.take_violations() == []


@pytest.mark.parametrize(
    ("argv", "marker"),
    [
        (["docker", "run", "x"], "docker"),
        (["/usr/bin/docker-compose", "up"], "docker"),
        (["/usr/bin/chromium", "--headless"], "browser"),
        (["npm", "exec", "x"], "process"),
        ([sys.executable, "-m", "service.cli", "serve"], "process"),
    ],
)
def test_each_command_needs_the_marker_of_what_it_starts(argv: list[str], marker: str) -> None:
    assert tiers.needed_marker(argv) == marker
    assert tiers.allowed({marker}, marker)
    assert not tiers.allowed(set(), marker)


def test_a_browser_or_docker_test_may_start_the_service_beside_it() -> None:
    assert tiers.allowed({"browser"}, "process") and tiers.allowed({"docker"}, "process")
    assert not tiers.allowed({"process"}, "docker") and not tiers.allowed({"process"}, "browser")


class FakeItem:
    def __init__(self, fixtures: list[str], markers: list[str]) -> None:
        self.fixturenames = fixtures
        self.markers = {m: getattr(pytest.mark, m).mark for m in markers}

    def get_closest_marker(self, name: str) -> Any:
        return self.markers.get(name)

    def add_marker(self, marker: Any) -> None:
        mark = marker.mark if hasattr(marker, "mark") else getattr(pytest.mark, marker).mark
        self.markers[mark.name] = mark


def test_fixtures_that_start_processes_mark_their_tests_and_groups_follow_markers() -> None:
    service = FakeItem(["live_service", "engine"], [])
    pages = FakeItem(["page_cost_templates"], [])
    stack = FakeItem([], ["docker"])
    plain = FakeItem(["api"], [])
    tiers.mark_collected([service, pages, stack, plain])  # type: ignore[list-item]
    assert set(service.markers) == {"process"}
    assert set(pages.markers) == {"page_costs"}
    assert stack.markers["xdist_group"].args == ("docker",)
    assert plain.markers == {}


def test_the_fast_tier_is_what_no_outside_marker_selects(request: pytest.FixtureRequest) -> None:
    """Every marker that takes a test out of the fast tier is one pytest knows (--strict-markers)."""
    known = {line.split(":")[0] for line in request.config.getini("markers")}
    assert set(tiers.OUTSIDE) <= known
    assert set(tiers.MARKERS) <= known
