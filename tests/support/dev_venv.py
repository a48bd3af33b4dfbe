"""Tests that run `python3 dev.py`: only where .venv is installed as dev.py would install it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev import installed_from

REPO = Path(__file__).resolve().parents[2]


STAMP = REPO / ".venv" / ".installed-pyproject"


needs_dev_venv = pytest.mark.skipif(
    not STAMP.exists() or STAMP.read_text() != installed_from(),
    reason="dev.py would (re)install .venv first: run `python3 dev.py install`",
)
