"""The GraphiQL page, served from this service's own copies of its scripts when they are present.

Without them the page falls back to Strawberry's CDN page, which offline shows
only "Loading...": the log says once how to fetch them.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from service.web.assets import VENDOR_DIR, Asset, missing_or_altered, pinned_assets

log = logging.getLogger(__name__)

# Relative to /graphql, so the page still finds its scripts when a proxy
# serves the service under a path prefix (/inventory/graphql -> /inventory/static/...).
LOCAL_PREFIX = "static/vendor/"


def local_page(cdn_page: str, assets: list[Asset], prefix: str = LOCAL_PREFIX) -> str:
    """Strawberry's page with every CDN URL pointed at the local copy.

    The integrity attributes stay: the browser checks the local files against
    the same hashes, so a corrupted copy fails loudly instead of half-working.
    """
    page = cdn_page
    for asset in assets:
        page = page.replace(asset.cdn_url, prefix + asset.local_path)
    return page


class GraphiQLPage:
    """Chooses between the local and the CDN page; checks the files until they are all there."""

    def __init__(self, cdn_page: str, vendor_dir: Path = VENDOR_DIR) -> None:
        self._cdn_page = cdn_page
        self._vendor_dir = vendor_dir
        self._assets = pinned_assets(cdn_page)
        self._local: str | None = None
        self._warned = False
        self._lock = threading.Lock()

    def html(self) -> str:
        if self._local is not None:
            return self._local
        with self._lock:
            if self._local is not None:
                return self._local
            # Checked again on every render while incomplete, so running
            # fetch-assets next to a running service takes effect without a restart.
            bad = missing_or_altered(self._vendor_dir, self._assets)
            if not bad:
                self._local = local_page(self._cdn_page, self._assets)
                log.info("GraphiQL is served with local assets from %s", self._vendor_dir)
                return self._local
            if not self._warned:
                self._warned = True
                log.warning(
                    "GraphiQL loads its scripts from unpkg.com, which an air-gapped browser cannot "
                    "reach (missing or altered: %s). Run `llmgw-inventory fetch-assets` where npm "
                    "can reach its registry to serve them from this service.",
                    ", ".join(bad),
                )
            return self._cdn_page
