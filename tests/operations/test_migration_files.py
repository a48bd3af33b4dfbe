"""The migrations' files list in the order alembic runs them: `<order>_<revision>_<what>.py`.

Revision ids are what deployed databases store (alembic_version), so they
never change; but ids given out of order by branches that merged (0015b ran
before 0014a) made the folder's listing lie about the chain. The file names
carry the order: the first three digits are the migration's place in the
chain, then its revision id, then what it does. A new migration's file takes
the next number (docs/contributing/development.md).
"""

from __future__ import annotations

import re
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

ALEMBIC = Path(__file__).resolve().parents[2] / "alembic"
VERSIONS = ALEMBIC / "versions"
NAME = re.compile(r"^(\d{3})_([0-9a-z]+)_[a-z0-9_]+\.py$")


def chain() -> list[tuple[str, str]]:
    """(revision, file name) of each migration, first to head, as alembic walks them."""
    config = Config()
    config.set_main_option("script_location", str(ALEMBIC))
    scripts = ScriptDirectory.from_config(config)
    assert len(scripts.get_heads()) == 1, "one head: the chain does not branch"
    walked = list(reversed(list(scripts.walk_revisions())))
    assert all(s.path is not None for s in walked)
    return [(s.revision, Path(str(s.path)).name) for s in walked]


def test_the_files_list_in_the_order_of_the_chain() -> None:
    walked = chain()
    listed = sorted(p.name for p in VERSIONS.glob("*.py"))
    assert listed == [name for _, name in walked], "the listing is not the chain's order"
    for place, (revision, name) in enumerate(walked, start=1):
        named = NAME.match(name)
        assert named is not None, f"{name}: not <order>_<revision>_<what>.py"
        assert int(named.group(1)) == place, f"{name}: is number {place} of the chain"
        assert named.group(2) == revision, f"{name}: its revision id is {revision!r}"


def test_each_squawk_exception_file_is_beside_its_migration() -> None:
    """alembic/squawk_lint.py reads `<migration>.squawk.toml` beside `<migration>.py`."""
    orphans = [
        p.name
        for p in VERSIONS.glob("*.squawk.toml")
        if not p.with_name(p.name.removesuffix(".squawk.toml") + ".py").exists()
    ]
    assert orphans == []
