"""The dashboard under headless Chromium: the service it talks to, the token typed in, what it asked for."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support import REPO
from tests.support.chromium import CHROMIUM, Page
from tests.support.live_service import LiveService
from tests.support.reports import REGISTER, node_input

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium package is not installed (apt-get install chromium); .ci/run installs it",
)


SCREENSHOTS = REPO / "screenshots"


TOKEN = "browser-test-operator-token"


BEARER = f"Bearer {TOKEN}"


@pytest.fixture
def service(live_service_factory: Any, engine: Any) -> LiveService:
    """The service as deployed, with an operator token (sent everywhere, needed or not).

    Pages of two nodes: the dashboard reads the node list on from each
    PAGE_TRUNCATED answer, as it must on a cluster larger than a page.
    """
    started: LiveService = live_service_factory(
        env={"INVENTORY_BOOTSTRAP_TOKEN": TOKEN, "INVENTORY_MAX_PAGE_SIZE": "2"}
    )
    return started


def call(service: LiveService, query: str, variables: dict[str, Any]) -> Any:
    response = httpx.post(
        service.url,
        json={"query": query, "variables": variables},
        headers={"Authorization": BEARER},
        timeout=10,
    )
    body = response.json()
    assert not body.get("errors"), body
    return body["data"]


def register(service: LiveService, node_id: str, **fields: Any) -> None:
    call(service, REGISTER, {"input": node_input(node_id, **fields)})


async def open_dashboard(page: Page, service: LiveService, fragment: str = "") -> None:
    """The dashboard (at `fragment`, e.g. "#node=gpu-01"), with the token typed into its Token field."""
    await page.goto(service.url.removesuffix("graphql") + fragment)
    await type_token(page)


async def type_token(page: Page) -> None:
    await page.evaluate(
        f"document.getElementById('token').value = {json.dumps(TOKEN)};"
        "document.getElementById('token-form').requestSubmit()"
    )


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def assert_nothing_came_from_outside(page: Page, service: LiveService) -> None:
    outside = [
        url
        for url in page.requested
        if url.startswith(("http:", "https:", "ws:", "wss:")) and origin(url) != origin(service.url)
    ]
    assert outside == []


# A GPU's marks after XID 79 (fleet health: tests/tools_and_docs/test_dashboard_health.py).
XID_79_TAINT = (
    "taint xid-79 NO_SCHEDULE by XID: xid 79: the GPU has fallen off the bus: it answers nothing"
    " until a reboot"
)
