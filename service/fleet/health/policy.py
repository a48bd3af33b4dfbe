"""The remediation policy: what an XID, a health reason or drift means, and what is done about it.

Built in: NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors, the
"Resolution Bucket (Immediate Action)" column) for the XIDs a node reports,
XID 154 taking the driver's own verdict (nvmlDeviceGetFieldValues with
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, which the agent reads: NONE, GPU_RESET,
NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET...), a few health reasons the agent
reports, and a rule per drift kind. The catalog's RESTART_BM (restart bare
metal) is REBOOT_NODE here, IGNORE is NONE.

Each rule says an action (what the operator's automation does: restart the
application, reset the GPU, reboot the node, call support), a scope (the GPU,
its NVLink group, or the node) and a taint effect (none: the GPU stays
usable). An operator's file (INVENTORY_REMEDIATION_POLICY, TOML) overrides any
rule and the limits:

    [breaker]            # GPUs of a class the policy may taint per hour
    fraction = 0.10      # at most this share of the class...
    floor = 8            # ...but never fewer than this many
    [validation]
    tests = ["dcgm_diag"]        # required to pass before re-admission
    allowed_failures = 3         # then ESCALATED
    [xid.79]
    action = "REBOOT_NODE"
    scope = "GPU"
    effect = "NO_SCHEDULE"       # or "none"
    [health.row_remap_failed]
    action = "CONTACT_SUPPORT"
    [drift.GPU_MISSING]
    scope = "NODE"
    effect = "PREFER_NO_SCHEDULE"

A file that does not parse, or names an unknown action, scope, effect, XID,
drift kind or key, stops the service at start-up with a message naming the
line (PolicyError). The policy in force is process-wide (install, current):
read once at start-up.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import Any

from service.bounds import MAX_ID_LENGTH
from service.config import SettingError
from service.scheduling.taints import TaintEffect

POLICY_VARIABLE = "INVENTORY_REMEDIATION_POLICY"


class RemediationAction(Enum):
    NONE = "NONE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    REBOOT_NODE = "REBOOT_NODE"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"


# The more drastic the larger: what a GPU with several faults is recommended.
SEVERITY = {action: rank for rank, action in enumerate(RemediationAction)}


class Scope(Enum):
    GPU = "GPU"
    NVLINK_GROUP = "NVLINK_GROUP"
    NODE = "NODE"


class DriftKind(Enum):
    GPU_MISSING = "GPU_MISSING"
    GPU_CLASS_CHANGED = "GPU_CLASS_CHANGED"
    HCA_MISSING = "HCA_MISSING"
    HCA_RATE_LOW = "HCA_RATE_LOW"
    NVLINK_DEGRADED = "NVLINK_DEGRADED"
    MEMORY_LOW = "MEMORY_LOW"


@dataclass(frozen=True)
class Rule:
    action: RemediationAction
    scope: Scope = Scope.GPU
    # None: no taint; the remediation is work for the automation only.
    effect: TaintEffect | None = TaintEffect.NO_SCHEDULE
    why: str = ""

    @property
    def acts(self) -> bool:
        """Whether the rule does anything: a remediation or a taint."""
        return self.action is not RemediationAction.NONE or self.effect is not None


NOTHING = Rule(RemediationAction.NONE, effect=None)
_A = RemediationAction


def _reset(why: str, scope: Scope = Scope.GPU) -> Rule:
    return Rule(_A.RESET_GPU, scope, TaintEffect.NO_SCHEDULE, why)


# NVIDIA's XID catalog, immediate action, for the XIDs that concern the GPU
# (the application's own, 13, 31, 43, 45, are counted and left alone).
XID_CATALOG: Mapping[int, Rule] = {
    48: _reset("double-bit ECC error: memory contents were corrupted"),
    63: Rule(_A.NONE, effect=None, why="ECC page retirement or row remapping recorded"),
    64: _reset("ECC page retirement or row remapping failed: the bad memory stays in use"),
    74: _reset("NVLink error: a link is down or degraded", Scope.NVLINK_GROUP),
    79: Rule(
        _A.REBOOT_NODE,
        Scope.GPU,
        TaintEffect.NO_SCHEDULE,
        "the GPU has fallen off the bus: it answers nothing until a reboot",
    ),
    92: _reset("high single-bit ECC error rate: memory is failing"),
    94: Rule(
        _A.RESTART_APP,
        Scope.GPU,
        None,
        "contained ECC error: the application was stopped, the GPU keeps working",
    ),
    95: _reset("uncontained ECC error: every application on the GPU is affected"),
    119: _reset("GSP RPC timeout: the GPU's system processor stopped answering"),
    120: _reset("GSP error: the GPU's system processor faulted"),
}


class DriverRecoveryAction(Enum):
    """The driver's verdict on a GPU (nvmlGpuRecoveryAction_t), as the agent reads it."""

    NONE = "NONE"
    GPU_RESET = "GPU_RESET"
    NODE_REBOOT = "NODE_REBOOT"
    DRAIN_P2P = "DRAIN_P2P"
    DRAIN_AND_RESET = "DRAIN_AND_RESET"
    RECOVER_IMEX_DOMAIN = "RECOVER_IMEX_DOMAIN"
    BUS_RESET = "BUS_RESET"
    SYSTEM_REBOOT = "SYSTEM_REBOOT"


# XID 154: the driver says what it needs (the agent sends GpuInput.recoveryAction).
RECOVERY_XID = 154
RECOVERY_ACTIONS: Mapping[str, RemediationAction] = {
    "NONE": _A.NONE,
    "GPU_RESET": _A.RESET_GPU,
    "NODE_REBOOT": _A.REBOOT_NODE,
    # Stop the processes that use peer-to-peer traffic: the applications restart.
    "DRAIN_P2P": _A.RESTART_APP,
    "DRAIN_AND_RESET": _A.RESET_GPU,
    "BUS_RESET": _A.RESET_GPU,
    "SYSTEM_REBOOT": _A.REBOOT_NODE,
    "RECOVER_IMEX_DOMAIN": _A.REBOOT_NODE,
}
HEALTH_RULES: Mapping[str, Rule] = {
    "row_remap_failed": Rule(
        _A.CONTACT_SUPPORT, why="row remapping failed: the memory cannot be repaired in place"
    ),
    "row_remap_pending": Rule(
        _A.RESET_GPU, effect=None, why="a row remap waits for the next reset"
    ),
}
# Drift (service/fleet/health/drift.py): each new finding is a remediation
# through act_on like an XID's (the breaker, the 7-day escalation), its
# action the one a person would take first:
DRIFT_RULES: Mapping[DriftKind, Rule] = {
    # A GPU gone from the enumeration has most often fallen off the bus
    # (XID 79, whose catalog action is RESTART_BM): a reboot re-enumerates the
    # PCIe bus. Still missing after it, the remediation is ESCALATED. A node
    # short of a GPU serves small shards still: a shape that needs the node's
    # full NVLink group tolerates nothing of it (the taint is on the node),
    # the others may tolerate the drift key.
    DriftKind.GPU_MISSING: Rule(_A.REBOOT_NODE, Scope.NODE, why="a GPU is missing"),
    # Another board (or one that reports less memory) is the vendor's to explain.
    DriftKind.GPU_CLASS_CHANGED: Rule(_A.CONTACT_SUPPORT, Scope.NODE, why="GPU class changed"),
    # An adapter gone or trained below its rate is a card, a cable or a
    # transceiver: a person's work, not a reset's. A rail's adapter taints
    # the GPUs of that rail, for multi-node shapes (the node when the rail
    # is unknown, as for a missing HCA).
    DriftKind.HCA_MISSING: Rule(_A.CONTACT_SUPPORT, Scope.GPU, why="an HCA is missing"),
    DriftKind.HCA_RATE_LOW: Rule(_A.CONTACT_SUPPORT, Scope.GPU, why="an HCA runs below its rate"),
    # NVLink trains at a GPU reset (XID 74's catalog action).
    DriftKind.NVLINK_DEGRADED: _reset("an NVLink group is smaller", Scope.NVLINK_GROUP),
    # A DIMM gone: the node still runs, used last until a person replaces it.
    DriftKind.MEMORY_LOW: Rule(
        _A.CONTACT_SUPPORT, Scope.NODE, TaintEffect.PREFER_NO_SCHEDULE, "memory is low"
    ),
}
# A drift finding's trigger: the key of its remediation and of its taint
# (drift-gpu-missing). Drift remediations are judged by the node's next
# report, not by the validation tests (remediations.py says how).
DRIFT_TRIGGER = "drift-"


def drift_trigger(kind: DriftKind) -> str:
    return DRIFT_TRIGGER + kind.value.lower().replace("_", "-")


def is_drift(trigger: str) -> bool:
    return trigger.startswith(DRIFT_TRIGGER)


DEFAULT_TESTS = ("dcgm_diag",)


@dataclass(frozen=True)
class Policy:
    xids: Mapping[int, Rule] = field(default_factory=lambda: dict(XID_CATALOG))
    health: Mapping[str, Rule] = field(default_factory=lambda: dict(HEALTH_RULES))
    drift: Mapping[DriftKind, Rule] = field(default_factory=lambda: dict(DRIFT_RULES))
    breaker_fraction: float = 0.10
    breaker_floor: int = 8
    # Tests that must pass after a remediation before its taint is lifted.
    validations: tuple[str, ...] = DEFAULT_TESTS
    allowed_failures: int = 3
    # A second remediation of a GPU within this long escalates (CONTACT_SUPPORT).
    escalate_within: timedelta = timedelta(days=7)

    def for_xid(self, xid: int, recovery: str | None = None) -> Rule:
        """The rule for an XID; XID 154 by the driver's recovery action (GPU_RESET when unknown)."""
        if xid == RECOVERY_XID and xid not in self.xids:
            action = RECOVERY_ACTIONS.get(recovery or "GPU_RESET", _A.RESET_GPU)
            if action is _A.NONE:
                return NOTHING
            effect = None if action is _A.RESTART_APP else TaintEffect.NO_SCHEDULE
            return Rule(action, Scope.GPU, effect, f"the driver asks for {recovery or 'a reset'}")
        return self.xids.get(xid, NOTHING)

    def breaker_limit(self, class_total: int) -> int:
        """GPUs of a class of `class_total` the policy may taint per hour.

        The fraction of the class rounded down ("at most" a tenth of 95 GPUs
        is 9, never 10), on the decimal the operator wrote: in binary floating
        point 0.57 * 100 is 56.99999999999999, which floor() made 56. Never
        below the floor.
        """
        share = Fraction(repr(self.breaker_fraction)) * class_total
        return max(self.breaker_floor, math.floor(share))


BUILT_IN = Policy()
_installed: Policy = BUILT_IN


def recommended(sticky: Sequence[str], recovery: str | None) -> RemediationAction:
    """Gpu.recommendedAction: the most drastic action its sticky XIDs and the driver ask for."""
    policy = current()
    actions = [RECOVERY_ACTIONS.get(recovery or "NONE", RemediationAction.NONE)]
    for reason in sticky:
        if reason.startswith("xid_") and reason[4:].isdigit():
            actions.append(policy.for_xid(int(reason[4:]), recovery).action)
    return max(actions, key=SEVERITY.__getitem__)


def install(policy: Policy) -> None:
    global _installed
    _installed = policy


def current() -> Policy:
    return _installed


class PolicyError(SettingError):
    """The policy file cannot be used; the message names the file, the line and the key."""


def _line_of(text: str, table: tuple[str, ...], key: str | None) -> int:
    """The line of `key` in the TOML table `table` (or of the table's header), 1-based; 0: unknown."""
    header = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")
    current_table: tuple[str, ...] = ()
    found = 0
    for number, line in enumerate(text.splitlines(), 1):
        match = header.match(line)
        if match:
            current_table = tuple(p.strip().strip('"') for p in match.group(1).split("."))
            if current_table == table and not found:
                found = number
            continue
        if key is not None and current_table == table:
            name = line.split("=", 1)[0].strip().strip('"') if "=" in line else None
            if name == key:
                return number
    return found


def _enum(kind: type[Enum], value: Any, where: str) -> Any:
    names = ", ".join(m.value for m in kind)
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{where} = {value!r}: not one of {names}") from None


def _rule(base: Rule, given: Any, where: str, lines: Any) -> Rule:
    if not isinstance(given, dict):
        raise ValueError(f"{where}: a table of action, scope, effect")
    rule = base
    for key, value in given.items():
        at = f"{where}.{key}"
        try:
            if key == "action":
                rule = replace(rule, action=_enum(RemediationAction, value, at))
            elif key == "scope":
                rule = replace(rule, scope=_enum(Scope, value, at))
            elif key == "effect":
                effect = None if value == "none" else _enum(TaintEffect, value, at)
                rule = replace(rule, effect=effect)
            else:
                raise ValueError(f"{at}: unknown key (action, scope, effect)")
        except ValueError as error:
            raise lines(key, error) from None
    return rule


def parse(text: str, source: str = POLICY_VARIABLE) -> Policy:
    """A policy from TOML text; PolicyError naming the line of the first problem."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        # tomllib's message names the line and column: "... (at line 3, column 9)".
        raise PolicyError(f"{source}: not TOML: {error}") from None

    def error_at(table: tuple[str, ...], key: str | None, problem: object) -> PolicyError:
        line = _line_of(text, table, key)
        at = f"line {line}: " if line else ""
        return PolicyError(f"{source}: {at}{problem}")

    policy = BUILT_IN
    for section, given in document.items():
        if section == "breaker":
            policy = _limits(policy, given, ("breaker",), error_at)
        elif section == "validation":
            policy = _limits(policy, given, ("validation",), error_at)
        elif section in ("xid", "health", "drift"):
            if not isinstance(given, dict):
                raise error_at((section,), None, f"[{section}] holds one table per rule")
            policy = _rules(policy, section, given, error_at)
        else:
            raise error_at(
                (section,),
                None,
                f"unknown section [{section}] (breaker, validation, xid, health, drift)",
            )
    return policy


def _rules(policy: Policy, section: str, given: dict[str, Any], error_at: Any) -> Policy:
    xids, health, drift = dict(policy.xids), dict(policy.health), dict(policy.drift)
    for name, table in given.items():
        where = f"{section}.{name}"

        def lines(key: str, problem: object, name: str = name) -> PolicyError:
            found: PolicyError = error_at((section, name), key, problem)
            return found

        if section == "xid":
            if not name.isdigit() or int(name) < 1:
                raise error_at((section, name), None, f"[{where}]: an XID is a positive integer")
            xid = int(name)
            base = xids.get(xid) or policy.for_xid(xid)
            xids[xid] = _rule(base, table, where, lines)
        elif section == "health":
            health[name] = _rule(health.get(name, NOTHING), table, where, lines)
        else:
            try:
                kind = _enum(DriftKind, name, f"[{where}]")
            except ValueError as error:
                raise error_at((section, name), None, error) from None
            drift[kind] = _rule(drift[kind], table, where, lines)
    return replace(policy, xids=xids, health=health, drift=drift)


def _limits(policy: Policy, given: Any, table: tuple[str, ...], error_at: Any) -> Policy:
    if not isinstance(given, dict):
        raise error_at(table, None, f"[{table[0]}] is a table")
    for key, value in given.items():
        at = f"{table[0]}.{key}"
        if table == ("breaker",) and key == "fraction":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
                raise error_at(table, key, f"{at} = {value!r}: a share between 0 and 1")
            policy = replace(policy, breaker_fraction=float(value))
        elif table == ("breaker",) and key == "floor":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise error_at(table, key, f"{at} = {value!r}: a number of GPUs, 0 or more")
            policy = replace(policy, breaker_floor=value)
        elif table == ("validation",) and key == "tests":
            if not isinstance(value, list) or not all(
                isinstance(t, str) and t and len(t) <= MAX_ID_LENGTH for t in value
            ):
                raise error_at(table, key, f"{at} = {value!r}: a list of test names")
            policy = replace(policy, validations=tuple(value))
        elif table == ("validation",) and key == "allowed_failures":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise error_at(table, key, f"{at} = {value!r}: a number of failures, 1 or more")
            policy = replace(policy, allowed_failures=value)
        else:
            raise error_at(table, key, f"{at}: unknown key")
    return policy


def load(path: str | None) -> Policy:
    """The policy a service runs with: the built-in one, or the file's overrides of it."""
    if path is None:
        return BUILT_IN
    source = f"{POLICY_VARIABLE}={path}"
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise PolicyError(f"{source}: cannot read it: {error.strerror}") from None
    return parse(text, source)
