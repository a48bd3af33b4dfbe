"""GraphiQL's assets for the tests that need the real ones: fetched once with the real code."""

from __future__ import annotations

from pathlib import Path

from service.web.assets import VENDOR_DIR, fetch


def local_assets() -> Path:
    """The vendor directory, filled as `fetch-assets` fills it (a no-op when already there).

    Fails (never skips) when the npm registry cannot be reached: CI must prove the real thing.
    """
    fetch(VENDOR_DIR)
    return VENDOR_DIR
