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

from tests.support import paths, tiers


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


@pytest.mark.parametrize("seeds", [range(24), [46, 4646, 464646], range(1), range(0)])
def test_a_seeded_family_runs_each_seed_once_and_together_on_both_paths(seeds: Any) -> None:
    """A family split between the paths loses no seed and runs none twice; from two seeds
    on, each path gets some (tests/support/paths.py)."""
    pairs = paths.seeds_on_paths(seeds, paths.chosen_paths("both"))
    assert [seed for seed, _ in pairs] == list(seeds)
    if len(pairs) >= 2:
        assert {path for _, path in pairs} == set(paths.PATHS)
    for one in paths.PATHS:
        # --path fast (or strawberry): every seed, on that path.
        assert paths.seeds_on_paths(seeds, paths.chosen_paths(one)) == [(s, one) for s in seeds]


class _Metafunc:
    """What paths.parametrise reads of pytest's Metafunc, and what it is asked to parametrise."""

    def __init__(self, fixtures: list[str], marks: list[Any]) -> None:
        self.fixturenames = fixtures
        self.definition = self
        self.marks = {m.name: m for m in marks}
        self.calls: list[tuple[Any, list[Any], Any]] = []

    def get_closest_marker(self, name: str) -> Any:
        return self.marks.get(name)

    def parametrize(self, names: Any, values: Any, ids: Any = None) -> None:
        self.calls.append((names, list(values), ids))


def test_seeded_families_are_split_and_stories_run_on_both_paths() -> None:
    story = _Metafunc(["api", "fast_path"], [])
    paths.parametrise(story, "both")  # type: ignore[arg-type]
    assert story.calls == [("fast_path", [True, False], ["fast", "strawberry"])]

    family = _Metafunc(["api", "fast_path", "seed"], [pytest.mark.seeds(range(3)).mark])
    paths.parametrise(family, "both")  # type: ignore[arg-type]
    assert family.calls == [
        (
            ("seed", "fast_path"),
            [(0, True), (1, False), (2, True)],
            ["0-fast", "1-strawberry", "2-fast"],
        )
    ]

    alone = _Metafunc(["api", "fast_path", "seed"], [pytest.mark.seeds(range(3)).mark])
    paths.parametrise(alone, "strawberry")  # type: ignore[arg-type]
    assert alone.calls[0][1] == [(0, False), (1, False), (2, False)]

    in_engine = _Metafunc(["engine", "seed"], [pytest.mark.seeds([7, 8]).mark])
    paths.parametrise(in_engine, "both")  # type: ignore[arg-type]
    assert in_engine.calls == [("seed", [7, 8], None)]
