"""The README's shell blocks, as a reader copies them."""

from __future__ import annotations

import re
from dataclasses import dataclass

NOT_RUN = "<!-- walkthrough: not run"


@dataclass
class Block:
    lang: str
    body: str
    not_run: bool


def blocks(text: str) -> list[Block]:
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\w*)$", lines[i])
        if opening is None:
            i += 1
            continue
        end = lines.index("```", i + 1)
        marked = i > 0 and lines[i - 1].startswith(NOT_RUN)
        found.append(Block(opening.group(1), "\n".join(lines[i + 1 : end]), marked))
        i = end + 1
    return found
