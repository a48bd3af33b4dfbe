"""Expected failures: what a caller did wrong, said so they can fix it.

The GraphQL layer turns these into readable errors (or typed results); any
other exception is a bug and is masked before it reaches a client.
"""

from __future__ import annotations

from typing import Any, Final

# How many characters of a value a caller sent an error message repeats: a
# prefix enough to recognise it, never the megabyte someone sent (issue 44:
# a 1 MB id was echoed back whole).
SHOWN_CHARACTERS: Final = 60


def shown(value: str, limit: int = SHOWN_CHARACTERS) -> str:
    """A text a caller sent, as an error message (or a log line) repeats it: the one rule.

    At most `limit` characters of it, cut with "..." and its length when
    longer, and every character that is not printable written as an escape
    (a NUL as \\x00, a lone surrogate as \\ud800, a newline as \\n): a
    message never carries more than a prefix of a bad value, nor a character
    that cannot be encoded or that breaks a log line.
    """
    cut = len(value) > limit
    text = value[: limit - 3] if cut else value
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escaped(c) for c in text)
    return f"{text}... ({len(value):,} characters)" if cut else text


def _escaped(character: str) -> str:
    return character.encode("unicode_escape", "backslashreplace").decode("ascii")


def shown_value(value: object) -> str:
    """Any value as a message repeats it: a text quoted (shown), anything else by its repr, cut."""
    if isinstance(value, str):
        return f"'{shown(value)}'"
    return shown(repr(value))


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
        super().__init__(f"{field}={shown_value(value)}: {problem}")
        self.field = field
        self.value = value

    @property
    def extensions(self) -> dict[str, Any]:
        value = self.value
        if isinstance(value, str):
            value = shown(value)
        elif not isinstance(value, (int, float, bool, type(None))):
            value = shown(repr(value))
        return {"code": self.code, "field": self.field, "value": value}


class TooManyEntries(InvalidInput):
    """A list longer than its bound (service/bounds.py): the length and the bound, never the list."""

    def __init__(self, field: str, length: int, bound: int) -> None:
        super().__init__(field, f"{length:,} entries", f"at most {bound:,} are accepted")
        self.length = length
        self.bound = bound

    @property
    def extensions(self) -> dict[str, Any]:
        return {**super().extensions, "length": self.length, "bound": self.bound}


class NodeNotFound(InventoryError):
    """The node id is not registered; an agent that sees this re-registers."""

    code = "NODE_NOT_FOUND"

    def __init__(self, node_id: str) -> None:
        super().__init__(f"node '{shown(node_id)}' is not registered")
        self.node_id = node_id

    @property
    def extensions(self) -> dict[str, Any]:
        return {"code": self.code, "nodeId": shown(self.node_id)}
