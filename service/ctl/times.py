"""Times as an operator types them: '15m', '2h', '30d' (from now, or ago), or an ISO-8601 date or time.

A time without a zone is UTC: the service's clock, and the only reading that
means the same instant on every operator's laptop.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

EXAMPLES = "a duration like 15m, 2h, 30d, 2w, or an ISO-8601 date or time (UTC unless it says)"


def _moment(flag: str, value: str, sign: int) -> datetime:
    match = _DURATION.match(value.strip())
    if match:
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        return datetime.now(UTC) + sign * timedelta(seconds=seconds)
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag}={value!r}: expected {EXAMPLES}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def since(value: str) -> datetime:
    """`--since`: '90s', '15m', '2h', '7d' ago, or an ISO-8601 time."""
    return _moment("--since", value, -1)


def expires(value: str) -> datetime:
    """`--expires`: '30d', '12h' from now, or an ISO-8601 date (its midnight, UTC) or time."""
    return _moment("--expires", value, +1)


def from_now(flag: str) -> Callable[[str], datetime]:
    """A parser for a flag naming a time ahead: '2h' from now, or an ISO-8601 time (`ctl maintenance`)."""
    return lambda value: _moment(flag, value, +1)


def seconds(value: str) -> int:
    """A duration as '90s', '15m', '2h', '1d' (or plain seconds), in whole seconds."""
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected seconds, or a duration like 90s, 15m, 2h, 1d"
        )
    return round(float(match.group(1)) * _UNIT_SECONDS[match.group(2)])
