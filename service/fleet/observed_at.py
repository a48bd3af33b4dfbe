"""When a reported fact was observed: the agent's clock, checked against the service's.

The one home of the skew rule. Every fact block a report carries (GPUs,
fabrics, storage, weights) says when the agent observed it, by the agent's
clock; schedulers ask for facts no older than some age (maxAge), which only
means something if those times are on the service's clock. So:

- A report may say when it was sent (`sentAt`, the agent's clock). The service
  compares it with its own receive time: when the two differ by more than the
  configured skew (INVENTORY_CLOCK_SKEW), the agent's clock is off, and every
  time in the report is shifted by the difference (the receive time minus
  sentAt). The report is stored, and the node says it was corrected and by how
  much (Node.observedAtCorrection); the caller logs and counts it.
- Within the skew, or without sentAt, the agent's times are taken as sent.
- A time that is still later than the receive time by more than the skew is
  refused (BAD_INPUT naming the field): a fact cannot be observed after it was
  received, and a fact from the future would never grow stale.
- A time that is later than the receive time by less than the skew is the
  receive time: two clocks within the skew of each other, and a fact's age is
  never negative.
- A block without observedAt was observed at the latest when it arrived: the
  receive time (agents older than this field).

A time without a UTC offset is refused: it names no instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from service.errors import InvalidInput

# INVENTORY_CLOCK_SKEW's default (service/config.py), in seconds: NTP keeps
# clocks within milliseconds; a few seconds leaves room for a slow request.
DEFAULT_SKEW = 5.0


def now() -> datetime:
    """The service's clock, as every receive time is read."""
    return datetime.now(UTC)


def _instant(field: str, value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(field, value.isoformat(), "needs a UTC offset (e.g. Z or +00:00)")
    return value


@dataclass(frozen=True)
class AgentClock:
    """What one report says about its sender's clock, against the service's."""

    received_at: datetime
    skew: timedelta
    # Added to every time the report carries; zero when the clocks agree
    # within the skew or the report did not say when it was sent.
    shift: timedelta

    @property
    def correction(self) -> str | None:
        """Why this report's times were shifted, for the node to show; None when they were not."""
        if not self.shift:
            return None
        seconds = self.shift.total_seconds()
        direction = "behind" if seconds > 0 else "ahead of"
        return (
            f"agent clock {abs(seconds):.1f} s {direction} the service's (allowed skew "
            f"{self.skew.total_seconds():g} s): observedAt times shifted by {seconds:+.1f} s"
        )

    def settle(self, field: str, observed_at: datetime | None) -> datetime:
        """The time a fact was observed, on the service's clock; raises InvalidInput as above."""
        if observed_at is None:
            return self.received_at
        try:
            settled = _instant(field, observed_at) + self.shift
        except OverflowError:
            # A sentAt centuries off shifts a time near the calendar's ends
            # (year 1 or 9999) past them: there is no instant to store (the
            # fuzzer's registerNode met it as an internal error).
            raise InvalidInput(
                field,
                observed_at.isoformat(),
                "out of range once shifted by the agent's clock offset (from input.sentAt)",
            ) from None
        ahead = settled - self.received_at
        if ahead > self.skew:
            raise InvalidInput(
                field,
                observed_at.isoformat(),
                # No measured figure in the words: the same request gets the same answer.
                f"later than the service received it by more than the allowed skew "
                f"({self.skew.total_seconds():g} s): a fact cannot be observed in the future",
            )
        return min(settled, self.received_at)


def agent_clock(
    sent_at: datetime | None,
    received_at: datetime,
    skew_seconds: float,
    field: str = "input.sentAt",
) -> AgentClock:
    """The report's clock: `sent_at` (the agent's) against `received_at` (the service's)."""
    skew = timedelta(seconds=skew_seconds)
    if sent_at is None:
        return AgentClock(received_at, skew, timedelta(0))
    offset = received_at - _instant(field, sent_at)
    return AgentClock(received_at, skew, offset if abs(offset) > skew else timedelta(0))
