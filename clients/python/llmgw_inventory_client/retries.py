"""Which calls are tried again, after what, and how long to wait first.

Only calls whose second run answers the same as the first are tried again:
reads, `place` and `allocate` (the same replicaId again answers what is
stored), `placeGroup` (the same groupId and input again answers the stored
group). A release is never tried again by the client: a second
releaseReplica of a replica that is gone, without its generation, leaves a
tombstone that refuses the id for a while (docs/scheduler/deadlines.md), and
scaleGroup adds replicas each time it runs. Their caller decides.

What is tried again: the service not reached, and the answers that say
"not now" (DATABASE_UNAVAILABLE, REQUEST_TIMEOUT, HTTP
502/503/504). Never a refusal (BAD_INPUT, CONFLICT, UNAUTHENTICATED...), which
a second try would only repeat.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# The root fields (= operation names) a second run answers the same.
IDEMPOTENT = frozenset(
    {
        # Reads.
        "freeGpus",
        "nodes",
        "node",
        "freeGpusCompiled",
        "nodesCompiled",
        "fit",
        "explainPlacement",
        "allocations",
        "shardsToMove",
        "gpuClasses",
        "group",
        "fitGroup",
        "explainGroupPlacement",
        # Writes keyed by the caller's id: the same call again answers what is stored.
        "place",
        "allocate",
        "placeGroup",
    }
)

# Every other operation the client sends, each sent once whatever happens.
NOT_RETRIED = frozenset(
    {
        "releaseReplica",  # again without a generation, after it freed: a tombstone
        "releaseGroup",  # again after it freed: CONFLICT or 0, not the first answer
        "scaleGroup",  # adds or removes replicas each time
        "events",  # a subscription: its caller resumes with `after`
    }
)

# The writes that hold GPUs, sent with X-Client-Timeout so that none commits
# after its caller stopped waiting. Not releases: one that commits late still
# frees what it finds, which is welcome (docs/scheduler/deadlines.md).
HOLD_GPUS = frozenset({"place", "allocate", "placeGroup", "scaleGroup"})


@dataclass(frozen=True)
class Retry:
    """How an idempotent call is tried again: at most `attempts` sends in all, waiting a
    random time up to `base` x 2^n (n: the tries so far), at most `cap`, and never less than
    the Retry-After the service asked for; never past the call's timeout."""

    attempts: int = 4
    base: float = 0.1
    cap: float = 5.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"Retry.attempts={self.attempts}: at least 1 (one send, no retry)")
        if self.base < 0 or self.cap < 0:
            raise ValueError(f"Retry(base={self.base}, cap={self.cap}): delays are not negative")

    def delay(self, tries: int, retry_after: float | None) -> float:
        """Seconds to wait before try number `tries` + 1 ("full jitter": schedulers that
        failed together do not come back together)."""
        jitter = self.rng.uniform(0, min(self.cap, self.base * 2**tries))
        return max(jitter, retry_after or 0.0)


NO_RETRY = Retry(attempts=1)
