"""An operator's browser, with no network but the service: GraphiQL answers, the dashboard shows the cluster.

Headless Chromium from Debian's `chromium` package, driven over the DevTools
protocol (tests/support/chromium.py); every host name but 127.0.0.1 fails to resolve,
as on an air-gapped cluster. Screenshots land in screenshots/ for a person to
look at.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from service.web.assets import VENDOR_DIR, missing_or_altered, pinned_assets
from tests.support import REPO
from tests.support.chromium import Page, chromium
from tests.support.dashboard import (
    BEARER,
    SCREENSHOTS,
    TOKEN,
    XID_79_TAINT,
    assert_nothing_came_from_outside,
    call,
    needs_chromium,
    open_dashboard,
    register,
    type_token,
)
from tests.support.dev_venv import needs_dev_venv
from tests.support.live_service import LiveService, free_port
from tests.support.reports import L40S, TB, gpus
from tests.support.topology import bridged_pairs
from tests.support.vendor_assets import local_assets

pytestmark = [pytest.mark.browser, needs_chromium]


CORDON = """
mutation Cordon($id: ID!, $reason: String!) { cordonNode(id: $id, reason: $reason) { id state } }
"""


def assert_only_refused_before_the_token(page: Page) -> None:
    """The one console error allowed: the service's 401 to a request sent before the token was."""
    assert [e for e in page.console_errors if "status of 401" not in e] == []


def graphql_posts(page: Page) -> list[dict[str, Any]]:
    return [r for r in page.requests if r["method"] == "POST" and r["url"].endswith("/graphql")]


def fabric(name: str) -> list[dict[str, Any]]:
    return [{"fabric": name, "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400}]


FREE_H100S = '{ freeGpus(gpuClass: "H100-80GB", minFree: 4) { node { id } gpuIndices } }'


@contextlib.contextmanager
def clean_checkout_assets(aside: Path) -> Iterator[None]:
    """The checkout without GraphiQL's scripts, as a fresh clone is; put back if none came."""
    if VENDOR_DIR.exists():
        shutil.move(VENDOR_DIR, aside)
    try:
        yield
    finally:
        if aside.exists() and missing_or_altered(VENDOR_DIR, pinned_assets()):
            shutil.rmtree(VENDOR_DIR, ignore_errors=True)
            shutil.move(aside, VENDOR_DIR)


@dataclass
class FirstServe:
    url: str
    log: Path


@pytest.fixture
def first_serve() -> Iterator[FirstServe]:
    """`python3 dev.py serve` in the state of a fresh clone: no data directory, no GraphiQL scripts."""
    root = Path(tempfile.mkdtemp(prefix="llmgw-first-serve-", dir="/tmp"))
    root.chmod(0o755)  # as root the embedded server runs as another user
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "INVENTORY_DATA_DIR"}}
    log = root / "serve.log"
    with clean_checkout_assets(root / "vendor-aside"), log.open("wb") as out:
        serve = subprocess.Popen(
            [sys.executable, str(REPO / "dev.py"), "serve", "--port", str(port),
             "--data-dir", str(root / "data")],
            env=env, stdout=out, stderr=out,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                assert serve.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                time.sleep(0.2)
            yield FirstServe(base, log)
        finally:
            serve.terminate()
            serve.wait(timeout=60)
            subprocess.run(["rm", "-rf", str(root)], check=False)


@needs_dev_venv
async def test_graphiql_renders_offline_from_the_first_dev_py_serve_with_no_extra_command(
    first_serve: FirstServe,
) -> None:
    async with chromium() as page:
        await page.goto(f"{first_serve.url}/graphql")
        await page.wait_for(
            "!!document.querySelector('.graphiql-query-editor .CodeMirror')",
            "GraphiQL's query editor",
        )
        await page.screenshot(SCREENSHOTS / "graphiql-first-start.png")
        assert page.errors == [] and page.console_errors == []
        requested = [u for u in page.requested if u.startswith("http")]
        assert requested and all(u.startswith(first_serve.url) for u in requested), requested
    said = await asyncio.to_thread(first_serve.log.read_text)
    assert "fetched GraphiQL's scripts" in said


async def test_graphiql_runs_a_query_from_local_assets_with_the_token_typed_in_its_headers_pane(
    service: LiveService,
) -> None:
    local_assets()
    register(service, "gpu-01", fabrics=fabric("ib-a"))
    register(service, "gpu-02", fabrics=fabric("ib-a"))
    call(service, CORDON, {"id": "gpu-02", "reason": "ECC storm"})

    async with chromium() as page:
        await page.goto(f"{service.url}?q={quote(FREE_H100S)}")
        await page.wait_for("!!document.querySelector('.graphiql-execute-button')", "GraphiQL")

        # The operator opens the Headers tab and types the token there.
        await page.evaluate(
            "[...document.querySelectorAll('.graphiql-editor-tools button')]"
            ".find(b => b.textContent === 'Headers').click()"
        )
        headers_editor = (
            'document.querySelector(\'section.graphiql-editor-tool[aria-label="Headers"] '
            ".graphiql-editor:not(.hidden) .CodeMirror')"
        )
        await page.wait_for(f"!!{headers_editor}", "the headers editor")
        typed = json.dumps({"Authorization": BEARER})
        await page.evaluate(f"{headers_editor}.CodeMirror.setValue({json.dumps(typed)})")
        # GraphiQL takes in an edit after a short debounce, then keeps the headers in the browser.
        await page.wait_for(
            f"(localStorage.getItem('graphiql:headers') || '').includes({json.dumps(TOKEN)})",
            "GraphiQL to take in the typed headers",
        )
        # GraphiQL asked for the schema before it had the token; ask again, with it.
        await page.evaluate(
            "document.querySelector('button[aria-label=\"Re-fetch GraphQL schema\"]').click()"
        )
        await page.evaluate(
            "document.querySelector('button[aria-label=\"Show Documentation Explorer\"]').click()"
        )
        await page.wait_for(
            "(document.querySelector('.graphiql-doc-explorer') || {}).innerText?.includes('Root Types')",
            "the schema's documentation",
        )
        await page.evaluate("document.querySelector('.graphiql-execute-button').click()")

        answer = await page.wait_for(
            "(() => { const r = document.querySelector('.result-window .CodeMirror');"
            " const v = r && r.CodeMirror.getValue(); return v && v.includes('freeGpus') && v; })()",
            "the query's answer in the result pane",
        )
        await page.screenshot(SCREENSHOTS / "graphiql-free-gpus.png")

        assert json.loads(answer) == {
            "data": {"freeGpus": [{"node": {"id": "gpu-01"}, "gpuIndices": list(range(8))}]}
        }
        query_posts = [r for r in graphql_posts(page) if "freeGpus" in r.get("postData", "")]
        assert query_posts and query_posts[-1]["headers"].get("Authorization") == BEARER
        introspections = [r for r in graphql_posts(page) if "__schema" in r.get("postData", "")]
        assert introspections[-1]["headers"].get("Authorization") == BEARER
        assert_nothing_came_from_outside(page, service)
        assert page.errors == []
        assert_only_refused_before_the_token(page)


ROWS = """
Object.fromEntries([...document.querySelectorAll('#nodes tbody tr')].map(tr => [
  tr.dataset.nodeId,
  Object.fromEntries(['state', 'reason', 'gpus', 'fabrics', 'disk', 'age', 'nvlink'].map(
    (name, i) => [name, tr.children[i + 1].innerText.trim()]))
]))
"""

SUMMARY = """
Object.fromEntries([...document.querySelectorAll('#summary tbody tr')].map(tr => [
  tr.dataset.gpuClass, [...tr.children].slice(1).map(td => Number(td.innerText))
]))
"""


async def test_the_dashboard_shows_unknown_disk_as_a_dash_and_a_cordoned_node_with_its_reason(
    service: LiveService,
) -> None:
    storage = [
        {"id": "dev:259:1", "mountPoint": "/data", "fsType": "xfs", "shared": False,
         "freeBytes": 2 * TB, "totalBytes": 3 * TB, "directories": ["/data/models"]},
    ]  # fmt: skip
    register(service, "gpu-01", fabrics=fabric("ib-a"), storage=storage, gpus=bridged_pairs())
    register(service, "gpu-02", fabrics=fabric("ib-b"))  # an old agent: disk unknown
    register(service, "gpu-03", gpus=gpus(L40S, 4), storage=storage)
    call(service, CORDON, {"id": "gpu-03", "reason": "fan failure, ticket OPS-1234"})

    async with chromium() as page:
        dashboard = service.url.removesuffix("graphql")
        await page.goto(dashboard)
        await page.wait_for(
            "document.getElementById('status').innerText.includes('token')",
            "the page to say it needs a token",
        )
        # The operator pastes a token once; the page keeps it in this browser.
        await type_token(page)
        await page.wait_for(
            "document.querySelectorAll('#nodes tbody tr').length === 3", "three node rows"
        )
        rows = await page.evaluate(ROWS)
        # The refusal of the first, token-less read is gone once the token worked.
        await page.wait_for(
            "!document.getElementById('status').classList.contains('error')",
            "the status to drop the token error",
        )
        await page.screenshot(SCREENSHOTS / "dashboard.png")

        assert rows["gpu-02"]["disk"] == "—"
        assert rows["gpu-01"]["disk"] == "2.00 TB / 3.00 TB"
        assert rows["gpu-03"]["state"] == "CORDONED"
        assert rows["gpu-03"]["reason"].startswith("fan failure, ticket OPS-1234")
        assert rows["gpu-01"]["state"] == "READY" and rows["gpu-01"]["reason"] == ""
        assert rows["gpu-01"]["gpus"] == "8 / 8 H100-80GB"
        assert rows["gpu-03"]["gpus"] == "4 / 4 L40S-48GB"
        assert (rows["gpu-01"]["fabrics"], rows["gpu-02"]["fabrics"]) == ("ib-a", "ib-b")
        assert rows["gpu-01"]["age"].endswith("s ago")
        assert rows["gpu-01"]["nvlink"] == "NVLink 2x4\nlargest free 2"
        assert rows["gpu-02"]["nvlink"] == "unknown"
        # total, free, allocated, unhealthy, unschedulable
        assert await page.evaluate(SUMMARY) == {
            "H100-80GB": [16, 16, 0, 0, 0],
            "L40S-48GB": [4, 0, 0, 0, 4],
        }

        # Another operator cordons a node: the page follows without a reload.
        await page.wait_for(
            "document.getElementById('status').innerText === 'live'", "the events subscription"
        )
        call(service, CORDON, {"id": "gpu-01", "reason": "ib-a maintenance"})
        await page.wait_for(
            "document.querySelector('tr[data-node-id=\"gpu-01\"] .state').innerText === 'CORDONED'",
            "gpu-01 to show as cordoned",
        )

        # Only the cordoned ones.
        await page.evaluate(
            "const s = document.getElementById('filter-state'); s.value = 'CORDONED';"
            "s.dispatchEvent(new Event('change', {bubbles: true}))"
        )
        shown = await page.evaluate(ROWS)
        await page.screenshot(SCREENSHOTS / "dashboard-cordoned.png")

        assert sorted(shown) == ["gpu-01", "gpu-03"]
        assert shown["gpu-01"]["reason"].startswith("ib-a maintenance")
        assert await page.evaluate("location.hash") == "#state=CORDONED"
        assert all(r["headers"].get("Authorization") == BEARER for r in graphql_posts(page)[-2:])
        assert_nothing_came_from_outside(page, service)
        assert page.errors == []
        assert_only_refused_before_the_token(page)


MARKS = """
[...document.querySelectorAll('tr[data-node-id="gpu-01"] .gpu-mark')].map(d => d.innerText.trim())
"""
XID_79_MARKS = f"{XID_79_TAINT}\nrecommended REBOOT_NODE\nremediation REBOOT_NODE PENDING: xid-79"
NODE_VIEW = """
({
  title: document.getElementById('node-view-title').innerText,
  gpus: [...document.querySelectorAll('#node-gpus tbody tr')].map(tr =>
    [...tr.children].map(td => td.innerText.trim())),
  xids: [...document.querySelectorAll('#node-xids tbody tr')].map(tr =>
    [...tr.children].slice(1).map(td => td.innerText.trim())),
})
"""


async def test_the_dashboard_marks_cordoned_and_xid_gpus_and_lists_a_nodes_recent_xids(
    service: LiveService,
) -> None:
    sick = gpus(L40S, 4)
    sick[2] = {**sick[2], "xids": [79]}
    sick[1] = {**sick[1], "xids": [31]}
    sick[0] = {**sick[0], "healthy": False, "healthReasons": ["ecc_uncorrected"]}
    register(service, "gpu-01", gpus=sick, bootId="boot-a")
    register(service, "gpu-02", gpus=gpus(L40S, 4))
    call(
        service,
        'mutation { cordonGpu(nodeId: "gpu-01", index: 3, reason: "fan noise") { index } }',
        {},
    )

    async with chromium() as page:
        await open_dashboard(page, service)
        await page.wait_for(
            "document.querySelectorAll('#nodes tbody tr').length === 2", "two node rows"
        )
        # The XID 79 GPU: sticky, the policy's taint, the reboot it recommends and the
        # remediation waiting for it (tests/tools_and_docs/test_dashboard_health.py).
        marks = ["GPU 0 ecc_uncorrected", f"GPU 2 xid_79\n{XID_79_MARKS}", "GPU 3 cordoned"]
        assert await page.evaluate(MARKS) == marks
        rows = await page.evaluate(ROWS)
        assert rows["gpu-01"]["gpus"].startswith("1 / 4 L40S-48GB")
        assert rows["gpu-02"]["gpus"] == "4 / 4 L40S-48GB"

        # The operator opens the node.
        await page.evaluate(
            "document.querySelector('tr[data-node-id=\"gpu-01\"] a.open-node').click()"
        )
        await page.wait_for(
            "document.querySelectorAll('#node-xids tbody tr').length === 2", "the node's XIDs"
        )
        shown = await page.evaluate(NODE_VIEW)
        await page.screenshot(SCREENSHOTS / "dashboard-node-xids.png")

        assert shown["title"] == "gpu-01"
        assert [g[:5] for g in shown["gpus"]] == [
            ["0", "L40S-48GB", "ecc_uncorrected", "—", "—"],
            ["1", "L40S-48GB", "ok", "—", "—"],
            ["2", "L40S-48GB", "xid_79", "xid_79", "—"],
            ["3", "L40S-48GB", "ok", "—", "fan noise"],
        ]
        # Most recent first (the report listed GPU 1's before GPU 2's).
        assert [x[:2] for x in shown["xids"]] == [["2", "79"], ["1", "31"]]
        assert "fallen off the bus" in shown["xids"][0][2]
        assert shown["xids"][1][2] == "the application's (the GPU stays healthy)"
        assert await page.evaluate("location.hash") == "#node=gpu-01"
        assert_nothing_came_from_outside(page, service)
        assert page.errors == []
        assert_only_refused_before_the_token(page)


DEMO_MARKS = """
Object.fromEntries([...document.querySelectorAll('#nodes tbody tr')].map(tr => [
  tr.dataset.nodeId,
  [...tr.querySelectorAll('.gpu-mark')].map(d => [d.className, d.innerText.trim()])]))
"""


async def test_the_dashboard_on_the_demo_cluster_marks_the_xid_gpu_and_the_cordoned_node(
    service: LiveService,
) -> None:
    from service.cli import main as inventory

    assert inventory(["demo", "--once", "--url", service.url, "--token", TOKEN]) == 0

    async with chromium() as page:
        await page.goto(service.url.removesuffix("graphql"))
        # Refused without a token: the hint names this page's own Token field.
        hint = await page.wait_for(
            "(() => { const s = document.getElementById('status');"
            " return s.classList.contains('error') && s.innerText; })()",
            "the page to say it needs a token",
        )
        assert "paste one into the Token field" in hint and "Headers" not in hint
        # Not "Nodes (0)": the cluster is not empty, it was not read.
        count = await page.evaluate("document.getElementById('count').innerText")
        assert count == "(a token is needed to read them)"
        await type_token(page)
        await page.wait_for(
            "document.querySelectorAll('#nodes tbody tr').length === 5", "the demo's five nodes"
        )
        await page.wait_for(
            "document.getElementById('status').innerText === 'live'", "the events subscription"
        )
        rows = await page.evaluate(ROWS)
        marks = await page.evaluate(DEMO_MARKS)
        await page.screenshot(SCREENSHOTS / "dashboard-demo.png")

        assert rows["hgx-04"]["state"] == "CORDONED"
        assert rows["hgx-04"]["reason"].startswith("PSU swap")
        assert rows["hgx-03"]["gpus"].startswith("7 / 8 H100-80GB")
        # The GPU the summary counts as unhealthy is found on its node: XID 79, sticky,
        # tainted by the policy, which recommends a reboot and has a remediation waiting.
        assert marks["hgx-03"] == [
            ["gpu-mark unhealthy sticky tainted", f"GPU 5 xid_79\n{XID_79_MARKS}"]
        ]
        assert {node: m for node, m in marks.items() if m} == {"hgx-03": marks["hgx-03"]}
        assert (rows["hgx-01"]["fabrics"], rows["hgx-03"]["fabrics"]) == ("ib-a", "ib-b")
        assert (await page.evaluate(SUMMARY))["H100-80GB"] == [32, 23, 0, 1, 8]

        # The live badge says why it is not live, then goes live again by itself.
        await page.evaluate("socket.close(4000, 'closed by the test')")
        why = await page.wait_for(
            "(() => { const t = document.getElementById('status').innerText;"
            " return t.startsWith('polling') && t; })()",
            "the badge to say it polls and why",
        )
        assert "the websocket closed (code 4000: closed by the test); retrying in" in why, why
        await page.wait_for("document.getElementById('status').innerText === 'live'", "live again")
        assert_nothing_came_from_outside(page, service)
        assert page.errors == []
        assert_only_refused_before_the_token(page)
