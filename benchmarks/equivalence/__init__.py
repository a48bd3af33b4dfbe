"""The fast path against the reference, on operations generated from the schema.

`explore` draws operations (operations.py) and sends each to both apps
(differential.py) on the seeded cluster (seed.py). The test suite runs it
with a fixed seed (tests/fast_path/test_fast_path_equivalence.py); the longer run is
`python -m benchmarks.equivalence --operations 5000`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import graphql
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from benchmarks.equivalence.differential import Answer, Difference, Differential
from benchmarks.equivalence.operations import Operation, operations
from service.graphql.schema import schema


@dataclass
class Exploration:
    operations: int = 0
    differences: list[Difference] = field(default_factory=list)
    # How the answers went (reference's status and whether it had data/errors), and the
    # features dressed onto the documents: a run that only met parse errors proves nothing.
    outcomes: Counter[str] = field(default_factory=Counter)
    features: Counter[str] = field(default_factory=Counter)
    # The reference's first error message, cut short: what the operations mostly ran into.
    errors: Counter[str] = field(default_factory=Counter)


def _outcome(answer: Answer | None) -> str:
    if answer is None or not isinstance(answer.body, dict):
        return "not JSON"
    data = "data" if answer.body.get("data") else "no data"
    errors = "errors" if answer.body.get("errors") else "no errors"
    return f"HTTP {answer.status}, {data}, {errors}"


def explore(
    loop: asyncio.AbstractEventLoop,
    differential: Differential,
    count: int,
    random_seed: int | None = None,
    progress: Callable[[Exploration], None] | None = None,
) -> Exploration:
    """Send `count` generated operations to both apps. random_seed None: derandomized
    (the same operations every run, as CI needs); otherwise that seed's draw."""
    sdl = schema.as_str()
    core = graphql.build_schema(sdl)
    found = Exploration()

    @settings(
        max_examples=count,
        derandomize=random_seed is None,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(operations(core, sdl))
    def one(operation: Operation) -> None:
        difference = loop.run_until_complete(differential.compare(operation))
        found.operations += 1
        found.features.update(operation.features)
        if difference is not None:
            found.differences.append(difference)
            found.outcomes["different"] += 1
        else:
            found.outcomes[_outcome(differential.last_reference)] += 1
            body = differential.last_reference.body if differential.last_reference else None
            if isinstance(body, dict) and body.get("errors"):
                found.errors[str(body["errors"][0].get("message"))[:70]] += 1
            elif isinstance(body, str):
                found.errors[body[:70]] += 1
        if progress is not None:
            progress(found)

    run = one if random_seed is None else hypothesis_seed(random_seed)(one)
    run()
    return found
