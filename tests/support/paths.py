"""The two ways the in-process service answers, and which tests run on which.

Every test whose fixtures build the in-process app (`client`, `api`, `api_as`,
`unreachable_client`) runs on each path (`fast_path` is parametrised in
tests/conftest.py), so each story also proves that the fast path answers as
Strawberry's view alone does, and that the service without the fast path
passes it (issue 45).

A seeded family (one test over many random clusters, `@pytest.mark.seeds(...)`
instead of parametrising `seed`) is not a story told twice but many draws of
one property: each seed runs once, on one path, the seeds taking the paths in
turn, so the family together still covers both paths and runs each seed it
lists exactly once. `--path fast` or `--path strawberry` runs every seed on
that path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

# The two ways the service answers a request (INVENTORY_FAST_PATH on and off).
PATHS = {"fast": True, "strawberry": False}

SEEDS_MARKER = "seeds"
SEEDS_DESCRIPTION = (
    "seeds(iterable): parametrise `seed` over these, each seed on one path (fast and strawberry"
    " in turn) instead of every seed on both (tests/support/paths.py)"
)


def chosen_paths(chosen: str) -> list[str]:
    """The paths `--path` asks for: both (the default), fast or strawberry."""
    return [name for name in PATHS if chosen in ("both", name)]


def seeds_on_paths(seeds: Iterable[Any], paths: list[str]) -> list[tuple[Any, str]]:
    """Each seed once, with the path it runs on: the paths in turn, seed by seed."""
    return [(seed, paths[i % len(paths)]) for i, seed in enumerate(seeds)]


def parametrise(metafunc: pytest.Metafunc, chosen: str) -> None:
    """`fast_path` (and a seeded family's `seed`) for one test function."""
    paths = chosen_paths(chosen)
    marker = metafunc.definition.get_closest_marker(SEEDS_MARKER)
    if marker is not None:
        (seeds,) = marker.args
        if "fast_path" not in metafunc.fixturenames:
            metafunc.parametrize("seed", list(seeds))
            return
        pairs = seeds_on_paths(seeds, paths)
        metafunc.parametrize(
            ("seed", "fast_path"),
            [(seed, PATHS[path]) for seed, path in pairs],
            ids=[f"{seed}-{path}" for seed, path in pairs],
        )
    elif "fast_path" in metafunc.fixturenames:
        metafunc.parametrize("fast_path", [PATHS[name] for name in paths], ids=paths)
