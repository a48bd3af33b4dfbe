"""Text that can be stored: the one rule every String and ID a request passes in must meet.

PostgreSQL's text holds every Unicode character but U+0000 (NUL), and its
driver cannot even send a lone surrogate (U+D800 to U+DFFF: half of a UTF-16
pair, not a character, which a JSON escape such as "\\ud800" decodes to).
Before issue 44 either one reaching a statement was the database's refusal:
a lone surrogate answered INTERNAL_ERROR (49 argument positions across 26
mutations), a NUL a BAD_INPUT that named no field.

The GraphQL layer applies the rule at the input boundary, to every String
and ID argument and input field, literal or variable, on both routes
(service/graphql/input_values.py), so a domain function is never handed such
a value; domain checks of the same thing call `storable` rather than
writing the rule again. An id is bounded too, as a node id is
(bounds.MAX_ID_LENGTH): an id longer than any stored one can name nothing.
"""

from __future__ import annotations

import re
from typing import Final

from service.bounds import MAX_ID_LENGTH

_UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")


def storable(value: str) -> bool:
    """Whether PostgreSQL text can hold `value` as it is."""
    return _UNSTORABLE.search(value) is None


def text_problem(value: str) -> str | None:
    """Why PostgreSQL text cannot hold `value`, naming the character and where; None when it can."""
    found = _UNSTORABLE.search(value)
    if found is None:
        return None
    character, at = found.group(), found.start()
    if character == "\x00":
        return f"contains a NUL character (U+0000) at character {at}, which text cannot hold"
    return (
        f"contains a lone surrogate (U+{ord(character):04X}) at character {at}: half of a "
        "UTF-16 pair, not a character, which text cannot hold"
    )


def id_problem(value: str) -> str | None:
    """Why `value` cannot be an id: longer than MAX_ID_LENGTH, or text that cannot be stored."""
    if len(value) > MAX_ID_LENGTH:
        return (
            f"{len(value):,} characters: an id is at most {MAX_ID_LENGTH} characters "
            "(MAX_ID_LENGTH)"
        )
    return text_problem(value)
