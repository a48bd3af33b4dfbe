"""Scalars beyond GraphQL's own: Bytes is a 64-bit byte count."""

from __future__ import annotations

from typing import Any, NewType

import strawberry

MAX_BYTES = (1 << 63) - 1


def _parse_bytes(value: Any) -> int:
    # bool is an int in Python; true must not read as one byte.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"Bytes must be a whole number of bytes, got {value!r}")
    if not 0 <= value <= MAX_BYTES:
        raise ValueError(f"Bytes must be between 0 and 2^63-1, got {value}")
    return value


Bytes = NewType("Bytes", int)

# Registered through the schema's scalar_map (see schema.py), so `Bytes`
# stays a plain int to the type checker.
BYTES_SCALAR = strawberry.scalar(
    name="Bytes",
    description="A byte count. GraphQL's Int is 32-bit, disks are not: serialized as a JSON integer.",
    serialize=int,
    parse_value=_parse_bytes,
)
