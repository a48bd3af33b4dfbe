"""The fast path's own tests: `client` is the service with the fast path on.

These tests compare the two ways of answering themselves (the `both`
fixture, tests/support/direct_execution.py), or look at what only the fast
path does (its routes, counters and hooks); tests/conftest.py's `client`
runs every other story on each path in turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.web.app import create_app


@pytest.fixture
async def client(engine: AsyncEngine, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.replace(fast_path=True), engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as c:
        yield c
