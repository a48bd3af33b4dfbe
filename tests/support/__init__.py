"""The one home of what several test modules share: fixtures' machinery, API helpers, fakes.

A test module (tests/**/test_*.py) imports from here, never from another test
module or a conftest (tests/tools_and_docs/test_test_imports.py holds that):
pytest imports a conftest as `conftest` while `from tests.conftest import X`
imports it a second time as another module, so a class defined there existed
twice and `isinstance` and `pytest.raises` quietly disagreed; and a test module
imported by another runs its module-level setup in a process that did not ask for it.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
