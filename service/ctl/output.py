"""How ctl shows things: aligned tables for people, JSON for scripts, human units, ages.

Unknown is a dash, never 0: a node that reported no disk has unknown disk,
and printing "0 B" would tell the operator it is full.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

DASH = "-"
_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")


def human_bytes(value: int | None) -> str:
    """Decimal units, as disks are sold: 2000000000000 -> '2.0 TB'."""
    if value is None:
        return DASH
    amount = float(value)
    for unit in _UNITS:
        if abs(amount) < 1000 or unit == _UNITS[-1]:
            return f"{int(amount)} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1000
    raise AssertionError("unreachable")


def free_of_total(disk: dict[str, Any] | None) -> str:
    if not disk:
        return DASH
    return f"{human_bytes(disk.get('freeBytes'))} / {human_bytes(disk.get('totalBytes'))}"


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def age(value: str | None, now: datetime | None = None) -> str:
    """'4s ago', '3m ago', '2h ago', '5d ago'; a dash when unknown."""
    if not value:
        return DASH
    seconds = max(0.0, ((now or datetime.now(UTC)) - parse_time(value)).total_seconds())
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def column_widths(
    headers: Sequence[str], rows: Sequence[Sequence[str]], at_least: Sequence[int] = ()
) -> list[int]:
    """Each column as wide as its widest cell (and at least `at_least[i]`)."""
    widths = [max(len(h), at_least[i] if i < len(at_least) else 0) for i, h in enumerate(headers)]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    return widths


def table_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    """One line of a table: the cells padded to `widths`, two spaces apart."""
    return "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(cells)).rstrip()


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int] | None = None
) -> str:
    widths = widths or column_widths(headers, rows)
    return "\n".join(table_row(line, widths) for line in [list(headers), *rows])


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def add_output_option(parser: Any) -> None:
    parser.add_argument(
        "--output",
        "-o",
        choices=("table", "json"),
        default="table",
        help="table for people (default), json for scripts",
    )
