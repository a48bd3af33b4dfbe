"""Scalars beyond GraphQL's own: Bytes is a 64-bit byte count; DateTime as Strawberry's, located."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NewType

import strawberry
from graphql import GraphQLError, ValueNode, value_from_ast_untyped

from service.bounds import MAX_BYTES

from .private_api import parse_strawberry_datetime


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


def _parse_datetime_literal(node: ValueNode, variables: dict[str, Any] | None = None) -> Any:
    # Strawberry's DateTime raises a GraphQLError for a malformed literal, which
    # graphql-core reports as it is: without the value's node, so the answer
    # could not say which argument was wrong. A plain ValueError is reported
    # with the node (and the parser's words), so extensions.field names it.
    try:
        return parse_strawberry_datetime(value_from_ast_untyped(node, variables))
    except GraphQLError as error:  # Strawberry's refusal; its message is the answer
        raise ValueError(str(error)) from None


# Strawberry's DateTime (name, description, serialization and variable parsing
# unchanged) with a literal parser that keeps its location.
DATETIME_SCALAR = strawberry.scalar(
    name="DateTime",
    description="Date with time (isoformat)",
    serialize=datetime.isoformat,
    parse_value=parse_strawberry_datetime,
    parse_literal=_parse_datetime_literal,
)


def utc(value: datetime | None) -> datetime | None:
    """A DateTime argument as the domain compares it: an isoformat without an offset is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
