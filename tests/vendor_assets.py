"""GraphiQL's assets for the tests that need the real ones: fetched once with the real command."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.web.assets import VENDOR_DIR, fetch


def local_assets_or_skip() -> Path:
    """The vendor directory, filled with `fetch-assets` (a no-op when .ci/run already did it)."""
    if shutil.which("npm") is None and not VENDOR_DIR.exists():
        pytest.skip("npm is not installed, so GraphiQL's assets cannot be fetched")
    # Fails (not skips) when npm is there but its registry is not: CI must prove the real thing.
    fetch(VENDOR_DIR)
    return VENDOR_DIR
