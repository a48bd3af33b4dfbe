"""The remediation policy: NVIDIA's XID catalog built in, an operator's TOML file over it, errors by line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service.config import Settings
from service.fleet.health import policy
from service.fleet.health.policy import RemediationAction, Scope, parse
from service.scheduling.taints import TaintEffect
from service.web.app import create_app
from tests.support import REPO


def test_the_catalog_and_the_drivers_verdict() -> None:
    built_in = policy.BUILT_IN
    rule = built_in.for_xid(79)
    assert (rule.action, rule.scope, rule.effect) == (
        RemediationAction.REBOOT_NODE,  # the catalog's RESTART_BM
        Scope.GPU,
        TaintEffect.NO_SCHEDULE,
    )
    assert built_in.for_xid(95).action is RemediationAction.RESET_GPU
    assert not built_in.for_xid(63).acts  # the catalog's IGNORE
    assert not built_in.for_xid(31).acts  # the application's
    assert built_in.for_xid(74).scope is Scope.NVLINK_GROUP
    # XID 154: what the driver asks for.
    assert built_in.for_xid(154, "NODE_REBOOT").action is RemediationAction.REBOOT_NODE
    assert built_in.for_xid(154, "GPU_RESET").action is RemediationAction.RESET_GPU
    drain = built_in.for_xid(154, "DRAIN_P2P")
    assert (drain.action, drain.effect) == (RemediationAction.RESTART_APP, None)
    assert not built_in.for_xid(154, "NONE").acts
    assert built_in.for_xid(154, None).action is RemediationAction.RESET_GPU
    # The breaker: a tenth of the class, never fewer than the floor.
    assert [built_in.breaker_limit(n) for n in (8, 80, 200, 1000)] == [8, 8, 20, 100]


def test_a_file_overrides_rules_and_limits() -> None:
    loaded = parse(
        """
        [breaker]
        fraction = 0.25
        floor = 4

        [validation]
        tests = ["dcgm_diag", "nccl_loopback"]
        allowed_failures = 2

        [xid.63]
        action = "RESET_GPU"
        effect = "PREFER_NO_SCHEDULE"

        [health.row_remap_pending]
        effect = "none"

        [drift.GPU_MISSING]
        scope = "GPU"
        """
    )
    assert (loaded.breaker_fraction, loaded.breaker_floor) == (0.25, 4)
    assert loaded.validations == ("dcgm_diag", "nccl_loopback")
    assert loaded.allowed_failures == 2
    assert loaded.for_xid(63).action is RemediationAction.RESET_GPU
    assert loaded.for_xid(63).effect is TaintEffect.PREFER_NO_SCHEDULE
    assert loaded.for_xid(79) == policy.BUILT_IN.for_xid(79)
    assert loaded.health["row_remap_pending"].effect is None
    assert loaded.drift[policy.DriftKind.GPU_MISSING].scope is Scope.GPU


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[xid.79]\naction = REBOOT\n", "not TOML: Invalid value (at line 2, column 10)"),
        (
            '[xid.79]\nscope = "GPU"\naction = "RESTART_BM"\n',
            "line 3: xid.79.action = 'RESTART_BM'",
        ),
        (
            '[xid.79]\nscope = "RACK"\n',
            "line 2: xid.79.scope = 'RACK': not one of GPU, NVLINK_GROUP",
        ),
        ('[xid.79]\neffect = "EVICT"\n', "line 2: xid.79.effect = 'EVICT'"),
        (
            '\n[xid.seventy]\naction = "NONE"\n',
            "line 2: [xid.seventy]: an XID is a positive integer",
        ),
        ('[drift.GPU_GONE]\nscope = "NODE"\n', "line 1: [drift.GPU_GONE] = 'GPU_GONE': not one of"),
        ('[xid.79]\nwhen = "always"\n', "line 2: xid.79.when: unknown key"),
        ("[breaker]\nfraction = 2\n", "line 2: breaker.fraction = 2: a share between 0 and 1"),
        ("[validation]\nallowed_failures = 0\n", "line 2: validation.allowed_failures = 0"),
        ("[remedies]\nx = 1\n", "line 1: unknown section [remedies]"),
    ],
)
def test_a_file_that_cannot_be_used_names_the_line(text: str, says: str) -> None:
    with pytest.raises(policy.PolicyError) as error:
        parse(text, "INVENTORY_REMEDIATION_POLICY=/etc/llmgw/policy.toml")
    message = str(error.value)
    assert message.startswith("INVENTORY_REMEDIATION_POLICY=/etc/llmgw/policy.toml: ")
    assert says in message, message


@pytest.mark.process
def test_the_service_does_not_start_with_a_bad_policy(tmp_path: Path) -> None:
    bad = tmp_path / "policy.toml"
    bad.write_text('[xid.79]\naction = "REBOOT_NODE"\nscope = "RACK"\n')
    with pytest.raises(policy.PolicyError):
        create_app(Settings(remediation_policy=str(bad)))
    missing = tmp_path / "nothing.toml"
    with pytest.raises(policy.PolicyError, match="cannot read it"):
        create_app(Settings(remediation_policy=str(missing)))
    # The command line says it in one line and exits 2, before any command runs.
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "fetch-assets", "--check"],
        env={"INVENTORY_REMEDIATION_POLICY": str(bad), "PATH": "/usr/bin:/bin"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"llmgw-inventory: INVENTORY_REMEDIATION_POLICY={bad}: line 3: "
        "xid.79.scope = 'RACK': not one of GPU, NVLINK_GROUP, NODE"
    )
    policy.install(policy.BUILT_IN)
