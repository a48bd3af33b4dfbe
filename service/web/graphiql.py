"""The GraphiQL page, served from this service's own copies of its scripts when they are present.

They are present from the first start: the service's wheel carries them, and
in a checkout `python3 dev.py serve` fetches them. When they are missing
anyway, the page is Strawberry's CDN page, which works where the browser
reaches unpkg.com; its placeholder, which offline would say only
"Loading..." forever, says instead what to run on the service's host (and the
log says it once).
"""

from __future__ import annotations

import logging
import re
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


# Strawberry's placeholder, shown until GraphiQL's scripts have loaded and replace it.
PLACEHOLDER = re.compile(r'(<div id="graphiql"[^>]*>)\s*Loading\.\.\.\s*(</div>)')

WITHOUT_LOCAL_COPIES = (
    "Loading GraphiQL from unpkg.com: this service has no copy of its scripts. If this stays, "
    "this browser cannot reach unpkg.com: on the service's host run "
    "<code>llmgw-inventory fetch-assets</code> (in a checkout, <code>python3 dev.py serve</code> "
    "fetches them as it starts), then reload this page."
)


def cdn_page_saying_what_to_run(cdn_page: str) -> str:
    """Strawberry's CDN page, its placeholder saying what to run when the CDN is out of reach."""
    page, replaced = PLACEHOLDER.subn(
        lambda m: (
            f'{m.group(1)}<p style="margin: 2em; font: 16px sans-serif">'
            f"{WITHOUT_LOCAL_COPIES}</p>{m.group(2)}"
        ),
        cdn_page,
        count=1,
    )
    if not replaced:
        # A Strawberry upgrade changed its page: the log still says what to run.
        log.warning("GraphiQL's page has no 'Loading...' placeholder to explain the missing assets")
    return page


class GraphiQLPage:
    """Chooses between the local and the CDN page; checks the files until they are all there."""

    def __init__(self, cdn_page: str, vendor_dir: Path = VENDOR_DIR) -> None:
        self._cdn_page = cdn_page
        self._vendor_dir = vendor_dir
        self._assets = pinned_assets(cdn_page)
        self._without_local = cdn_page_saying_what_to_run(cdn_page)
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
                    "reach (missing or altered: %s). Run `llmgw-inventory fetch-assets` where the "
                    "npm registry is reachable to serve them from this service.",
                    ", ".join(bad),
                )
            return self._without_local
