"""The source scan behind each "one definition per rule" test.

A rule written twice drifts: one copy is fixed, the other keeps the bug.
Each rule's test lists what a second definition of it looks like; this scan
finds such a line anywhere under service/ except the rule's home and names
the file and the line, so the failure says where to look.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service"

# Sources a rule could be written in: the service's Python, and the
# dashboard's JavaScript and HTML for the rules it shows.
PYTHON = ("*.py",)
PYTHON_AND_DASHBOARD = ("*.py", "*.js", "*.html")


def second_definitions(
    home: Path,
    patterns: Mapping[str, re.Pattern[str]],
    *,
    kinds: Iterable[str] = PYTHON,
    excused: Mapping[tuple[str, str], str] | None = None,
) -> list[str]:
    """Each line outside `home` that matches a pattern, as "file:line: what: text".

    `excused` maps (file, text on the line) to why that line matches but
    defines nothing.
    """
    excused = excused or {}
    files = sorted({path for kind in kinds for path in SERVICE.rglob(kind)})
    found = []
    for path in files:
        if path == home:
            continue
        name = str(path.relative_to(ROOT))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if any(name == file and part in line for file, part in excused):
                continue
            for what, pattern in patterns.items():
                if pattern.search(line):
                    found.append(f"{name}:{number}: {what}: {line.strip()}")
    return found
