"""Retry delays: exponential, capped, with jitter."""

import random
from collections.abc import Callable


class Backoff:
    """Doubling delays from `first` up to `cap`, each scaled by a random 50-100%.

    The jitter matters at fleet scale: when the service restarts, every agent
    fails at the same moment, and without it they would all retry at the same
    moments too, hitting the service in waves exactly when it is coming up.
    """

    def __init__(self, first: float, cap: float, rand: Callable[[], float] = random.random) -> None:
        self.first = first
        self.cap = cap
        self._rand = rand
        self.failures = 0

    def next(self) -> float:
        # The exponent is bounded so a week-long outage cannot overflow a float.
        delay = min(self.cap, self.first * 2.0 ** min(self.failures, 32))
        self.failures += 1
        return delay * (0.5 + 0.5 * self._rand())

    def reset(self) -> None:
        self.failures = 0
