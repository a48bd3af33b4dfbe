"""A served process settles its heap once started (service/web/heap.py), and still collects garbage."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from service.web.heap import YOUNG_THRESHOLD
from tests.support import REPO
from tests.support.live_service import LiveService

pytestmark = pytest.mark.process


def _sample(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_a_served_process_has_frozen_its_startup_heap(live_service: LiveService) -> None:
    metrics = httpx.get(live_service.url.replace("/graphql", "/metrics"), timeout=10).text

    # The schema, SQLAlchemy and the modules: far more than a bare interpreter's.
    assert _sample(metrics, "inventory_gc_frozen_objects") > 20_000
    assert 'inventory_gc_collections_total{generation="2"}' in metrics


def test_garbage_made_after_settling_is_still_collected() -> None:
    # In a process of its own: settling freezes the whole heap of the process it runs in.
    script = """
import gc, weakref
from service.web import heap
heap.settle()
assert gc.get_threshold()[0] == YOUNG, gc.get_threshold()

class Cycle:
    pass

a, b = Cycle(), Cycle()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print("collected" if gone() is None else "leaked", gc.get_freeze_count())
""".replace("YOUNG", str(YOUNG_THRESHOLD))
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    outcome, frozen = result.stdout.split()
    assert outcome == "collected"
    assert int(frozen) > 0
