"""Expected failures: what a caller did wrong, said so they can fix it.

The GraphQL layer turns these into readable errors (or typed results); any
other exception is a bug and is masked before it reaches a client.
"""

from __future__ import annotations

from typing import Any


class InventoryError(Exception):
    """A failure the caller can act on. `code` is stable and machine-readable.

    `extensions` is read by graphql-core when it wraps the exception, so the
    code, field and value reach the client without per-resolver handling.
    """

    code = "INVENTORY_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code}


class InvalidInput(InventoryError):
    """One field of a request is unusable; nothing of the request was written."""

    code = "BAD_INPUT"

    def __init__(self, field: str, value: Any, problem: str) -> None:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{field}={shown}: {problem}")
        self.field = field
        self.value = value

    @property
    def extensions(self) -> dict[str, Any]:
        value = self.value
        if not isinstance(value, (str, int, float, bool, type(None))):
            value = repr(value)
        elif isinstance(value, str) and len(value) > 300:
            value = value[:300] + "..."
        return {"code": self.code, "field": self.field, "value": value}


class NodeNotFound(InventoryError):
    """The node id is not registered; an agent that sees this re-registers."""

    code = "NODE_NOT_FOUND"

    def __init__(self, node_id: str) -> None:
        super().__init__(f"node {node_id!r} is not registered")
        self.node_id = node_id

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "nodeId": self.node_id}
