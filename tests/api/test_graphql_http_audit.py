"""The GraphQL-over-HTTP audit that ships with npm's graphql-http, run against a live service.

`auditServer` is the spec authors' own conformance check. It runs every rule
(MUST, SHOULD, MAY) against the endpoint; a failed MUST is an error, a failed
SHOULD a warning. Before application/graphql-response+json was served it
reported 8 warnings; the service must now pass with none of either.

The package is installed with npm into a cache directory (LLMGW_NPM_CACHE, else
.cache/ in the repository), once per version: CI has npm (.ci/run installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.access_control import tokens
from tests.support import REPO
from tests.support.live_service import LiveService

pytestmark = pytest.mark.process

GRAPHQL_HTTP = "graphql-http@1.23.1"
GRAPHQL_JS = "graphql@16.11.0"  # graphql-http's peer dependency

AUDIT = """
import { auditServer } from 'graphql-http';
const token = process.env.AUDIT_TOKEN;
const results = await auditServer({
  url: process.env.AUDIT_URL,
  fetchFn: (input, init = {}) => {
    const headers = new Headers(init.headers);
    headers.set('authorization', `Bearer ${token}`);
    return fetch(input, { ...init, headers });
  },
});
const shown = [];
for (const result of results) {
  const entry = { id: result.id, name: result.name, status: result.status };
  if (result.status !== 'ok') {
    entry.reason = result.reason;
    entry.response = result.response ? await result.response.text() : undefined;
  }
  shown.push(entry);
}
console.log(JSON.stringify(shown));
"""


def audit_package() -> Path:
    """The directory holding node_modules/graphql-http, installed on first use."""
    cache = Path(os.environ.get("LLMGW_NPM_CACHE", REPO / ".cache" / "npm"))
    where = cache / f"{GRAPHQL_HTTP}-{GRAPHQL_JS}".replace("@", "-")
    if (where / "node_modules" / "graphql-http" / "package.json").exists():
        return where
    if shutil.which("npm") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("npm is missing in CI: .ci/run installs it")
        pytest.skip("npm is not installed, so graphql-http's audit cannot run")
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(where),
         GRAPHQL_HTTP, GRAPHQL_JS],
        check=True,
        timeout=300,
    )  # fmt: skip
    return where


async def test_the_graphql_over_http_audit_finds_no_warning_and_no_error(
    live_service: LiveService, engine: AsyncEngine
) -> None:
    package = audit_package()
    # Tokens in force, as in production: the audit's fetch adds one.
    async with engine.begin() as conn:
        created = await tokens.create_token(conn, "reader", None, description="graphql-http audit")
    done = await asyncio.to_thread(
        subprocess.run,
        ["node", "--input-type=module", "-e", AUDIT],
        cwd=package,
        env={**os.environ, "AUDIT_URL": live_service.url, "AUDIT_TOKEN": created.secret},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results: list[dict[str, Any]] = json.loads(done.stdout)
    assert len(results) > 50  # every rule ran
    failed = [r for r in results if r["status"] in ("warn", "error")]
    assert not failed, json.dumps(failed, indent=1)
    # MAY rules (notices) pass too: each is a behaviour a client may rely on here.
    notices = [r for r in results if r["status"] == "notice"]
    assert not notices, json.dumps(notices, indent=1)
