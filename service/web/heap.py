"""The server process's heap: frozen once started, collected less often.

The service's heap after startup is mostly its schema (Strawberry's and
graphql-core's types), SQLAlchemy's and the modules': a hundred thousand and
more long-lived objects. CPython's cyclic collector walks all of them in
every full collection, and one was triggered every few thousand requests
by the objects in flight being promoted; with the default threshold of 700,
the objects of a few dozen concurrent requests alone started a young
collection about once per batch of heartbeats, a large share of a
heartbeat's own CPU (docs/history/benchmarks-journal.md has the figures).

So, once the process is set up: everything alive is collected once and
frozen (gc.freeze: never walked again; none of it is garbage), and a young
collection waits for 10,000 new objects rather than 700, which the requests
in flight do not reach on their own. Cyclic garbage is still collected,
a little later.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

# New container objects before a young collection (CPython's default: 700).
YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Collect, freeze what is left, and raise the young generation's threshold."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    log.info("heap settled: %d objects frozen", gc.get_freeze_count())
