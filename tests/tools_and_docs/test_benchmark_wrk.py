"""The floor section's load generator (benchmarks/wrk.py): a wrong answer is a failure, not a fast request.

Against the floor itself (benchmarks/floor.py), which answers 400 with a
GraphQL error for a body without a query: wrk's rate would count those as
answered requests, so the Lua script counts them as failures.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks import wrk
from benchmarks.client import request_body
from benchmarks.floor import HEARTBEAT, Target, _round, floor_process

pytestmark = pytest.mark.skipif(wrk.WRK is None, reason="wrk is not installed (CI installs it)")


@pytest.mark.process
def test_wrk_counts_wrong_answers_and_sends_every_body_as_written() -> None:
    # A body holding "]]" (which ends a plain Lua long string) must reach the
    # floor intact: the floor answers 200 only to a JSON object with a query.
    good = json.dumps({"query": '{ a(x: "]] ]=]") }'}).encode()
    bad = json.dumps({"nope": 1}).encode()
    with floor_process() as (url, _pid):
        only_good = wrk.run(url, [good], {}, connections=4, seconds=1)
        half_bad = wrk.run(url, [good, bad], {}, connections=4, seconds=1)
    assert only_good.requests > 100
    assert only_good.failures == 0
    assert only_good.rate > 0
    # Every other request is the bad body: about half are failures, and the
    # rate counts only the answered ones.
    assert half_bad.requests > 100
    assert 0.4 < half_bad.failures / half_bad.requests < 0.6
    answered = half_bad.requests - half_bad.failures
    assert half_bad.rate == pytest.approx(answered / half_bad.seconds)


def test_a_lua_long_string_holds_any_text() -> None:
    for text in ("plain", "]]", "]=]", "a]]b]=]c]==]"):
        quoted = wrk._lua_string(text)
        opening = quoted[: quoted.index("[", 1) + 1]  # [[, [=[, [==[ ...
        closing = opening.replace("[", "]")
        assert quoted == opening + text + closing
        assert closing not in text


@pytest.mark.process
def test_a_round_says_how_busy_the_process_was() -> None:
    """The floor row's note: rate x CPU a request is the share of the round its process ran.

    The figure is a share of the round, not milliseconds. How large a share
    depends on what else the machine runs (other test workers, other jobs on
    shared cores), so only its bounds and its definition are asserted.
    """
    bodies = [request_body(HEARTBEAT, {"id": f"node-{i:06d}"}) for i in range(8)]
    with floor_process() as (url, pid):
        target = Target(url, pid)
        asyncio.run(_round(target, bodies, 1))
    [busy], [rate], [cpu_ms] = target.busy.values, target.rate.values, target.cpu.values
    assert 0 < busy <= 1.05
    assert busy == pytest.approx(rate * cpu_ms / 1000, rel=0.1)
