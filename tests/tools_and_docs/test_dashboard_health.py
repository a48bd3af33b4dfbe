"""The dashboard marks fleet health on each node and GPU: taints, drift, the recommended action, open remediations.

An operator has the page open while the cluster happens to it through the
API: an agent reports XID 79, another operator taints a node and a GPU, a
node comes back short of a GPU its hardware profile names, the automation
starts the remediation. Each shows, live, as words (what, its effect or
state, who set it, why), not as a colour alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.chromium import Page, chromium
from tests.support.dashboard import (
    SCREENSHOTS,
    XID_79_TAINT,
    assert_nothing_came_from_outside,
    call,
    needs_chromium,
    open_dashboard,
    register,
)
from tests.support.live_service import LiveService
from tests.support.reports import H100, L40S, gpus

# Skipped without Chromium, like the other browser tests.
pytestmark = [pytest.mark.browser, needs_chromium]

LABELS = [{"key": "profile", "value": "hgx-h100"}]
PROFILE = "mutation P($p: HardwareProfileInput!) { setHardwareProfile(input: $p) { name } }"
TAINT_NODE = "mutation T($n: ID!, $t: TaintInput!) { taintNode(nodeId: $n, taint: $t) { id } }"
TAINT_GPUS = (
    "mutation T($n: ID!, $i: [Int!]!, $t: TaintInput!)"
    " { taintGpus(nodeId: $n, indices: $i, taint: $t) { index } }"
)
START = "mutation S($id: ID!) { startRemediation(id: $id) { state } }"

# Per node row: its own marks, and each marked GPU's lines.
MARKS = """
Object.fromEntries([...document.querySelectorAll('#nodes tbody tr')].map(tr => [
  tr.dataset.nodeId,
  {node: [...tr.querySelectorAll('.node-mark')].map(d => d.innerText.trim()),
   gpus: Object.fromEntries([...tr.querySelectorAll('.gpu-mark')].map(d =>
     [d.dataset.gpuIndex, [...d.querySelectorAll('.mark')].map(m => m.innerText.trim())]))}]))
"""
NODE_VIEW = """
({
  node: [...document.querySelectorAll('#node-marks .mark')].map(d => d.innerText.trim()),
  gpus: [...document.querySelectorAll('#node-gpus tbody tr')].map(tr =>
    [...tr.querySelectorAll('td.marks .mark')].map(m => m.innerText.trim())),
})
"""


def report(node_id: str, count: int = 8, **faults: Any) -> dict[str, Any]:
    listed = [{**g, **faults.get(f"gpu{g['index']}", {})} for g in gpus(H100, 8)][:count]
    return {"gpus": listed, "labels": LABELS, "bootId": "boot-a"}


async def marks_until(page: Page, check: str, what: str) -> dict[str, Any]:
    """The marks once the live page shows what `check` (JS over `m`, the marks) wants."""
    await page.wait_for(f"(() => {{ const m = {MARKS}; return {check}; }})()", what)
    found: dict[str, Any] = await page.evaluate(MARKS)
    return found


async def test_the_dashboard_marks_taints_drift_and_remediations_as_they_happen(
    service: LiveService,
) -> None:
    call(service, PROFILE, {"p": {"name": "hgx-h100", "selector": LABELS[0], "gpuCount": 8}})
    register(service, "gpu-01", **report("gpu-01"))
    register(service, "gpu-02", gpus=gpus(L40S, 4))

    async with chromium() as page:
        await open_dashboard(page, service)
        await page.wait_for(
            "document.getElementById('status').innerText === 'live'", "the events subscription"
        )
        quiet = await page.evaluate(MARKS)
        assert quiet == {n: {"node": [], "gpus": {}} for n in ("gpu-01", "gpu-02")}

        # gpu-01's agent reports XID 79 on GPU 3: the policy's taint, its recommended
        # action and a PENDING remediation, on that GPU only.
        register(service, "gpu-01", **report("gpu-01", gpu3={"xids": [79]}))
        marks = await marks_until(page, "m['gpu-01'].gpus['3']", "GPU 3's XID marks")
        assert marks["gpu-01"]["gpus"] == {
            "3": [
                XID_79_TAINT,
                "recommended REBOOT_NODE",
                "remediation REBOOT_NODE PENDING: xid-79",
            ]
        }

        # Another operator taints gpu-02 whole and one of its GPUs.
        infer = {"key": "dedicated", "value": "infer", "effect": "NO_EXECUTE",
                 "reason": "inference only"}  # fmt: skip
        call(service, TAINT_NODE, {"n": "gpu-02", "t": infer})
        burn_in = {"key": "burn-in", "effect": "PREFER_NO_SCHEDULE", "reason": "new card"}
        call(service, TAINT_GPUS, {"n": "gpu-02", "i": [1], "t": burn_in})
        marks = await marks_until(
            page, "m['gpu-02'].node.length && m['gpu-02'].gpus['1']", "gpu-02's taints"
        )
        assert marks["gpu-02"] == {
            "node": ["taint dedicated=infer NO_EXECUTE by OPERATOR: inference only"],
            "gpus": {"1": ["taint burn-in PREFER_NO_SCHEDULE by OPERATOR: new card"]},
        }

        # gpu-01 comes back with seven of its profile's eight GPUs: drift, the policy's
        # taint on the node and its remediation of the node (a reboot re-enumerates).
        register(service, "gpu-01", **report("gpu-01", count=7, gpu3={"xids": [79]}))
        marks = await marks_until(page, "m['gpu-01'].node.length >= 3", "gpu-01's drift")
        node_marks = marks["gpu-01"]["node"]
        assert node_marks == [
            "taint drift-gpu-missing NO_SCHEDULE by DRIFT: GPU_MISSING: expected 8 GPUs,"
            " observed 7 GPUs",
            "drift GPU_MISSING: expected 8 GPUs, observed 7 GPUs",
            "remediation REBOOT_NODE PENDING: drift-gpu-missing (GPUs 0, 1, 2, 3, 4, 5, 6)",
        ]
        # Not repeated on each GPU: GPU 3 keeps its own.
        assert list(marks["gpu-01"]["gpus"]) == ["3"]

        # The operator's automation starts the remediation: its state follows.
        listed = call(service, "{ remediations { id trigger } }", {})["remediations"]
        [xid] = [r["id"] for r in listed if r["trigger"] == "xid-79"]
        call(service, START, {"id": xid})
        marks = await marks_until(
            page,
            "m['gpu-01'].gpus['3'].includes('remediation REBOOT_NODE IN_PROGRESS: xid-79')",
            "the remediation in progress",
        )
        await page.screenshot(SCREENSHOTS / "dashboard-fleet-health.png")

        # The node's view says the same, GPU by GPU.
        await page.evaluate(
            "document.querySelector('tr[data-node-id=\"gpu-01\"] a.open-node').click()"
        )
        await page.wait_for(
            "document.querySelectorAll('#node-gpus tbody tr').length === 7", "gpu-01's GPUs"
        )
        await page.wait_for("document.querySelectorAll('#node-marks .mark').length", "its marks")
        shown = await page.evaluate(NODE_VIEW)
        await page.screenshot(SCREENSHOTS / "dashboard-fleet-health-node.png")
        assert shown["gpus"][3] == [
            XID_79_TAINT, "recommended REBOOT_NODE", "remediation REBOOT_NODE IN_PROGRESS: xid-79"
        ]  # fmt: skip
        assert [g for i, g in enumerate(shown["gpus"]) if i != 3] == [[]] * 6
        assert shown["node"] == node_marks
        assert_nothing_came_from_outside(page, service)
        assert page.errors == []
