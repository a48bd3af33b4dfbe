"""A seeded random model of the remediation policy, written from docs/operations/remediation.md.

The outside check that found issue 44's item 5 was a model of the policy as
the documentation states it, driven by random XIDs, reboots, resets,
validations and operator taints, and compared with the service after each
step. This is that check, kept: the model below reads only the docs (the
XID table, the breaker, "A fault on GPUs that already have a remediation",
"After ESCALATED", validation; docs/operations/gpus.md for sticky health;
docs/scheduler/taints.md for what a taint withholds), never the service's
code. Where the two disagree, one of them is a defect.

After every step it compares, for three nodes (H100 of unknown topology, H100
on one NVSwitch board, A100 with NVLink groups 0-3 and 4-7), each GPU's taints,
health reasons and recommendedAction, each node's taints, freeGpus and
validationsToRun, and every remediation (GPUs, action, state, trigger,
taintKey). Each seed also picks one of three operator policies (built in; a
tight breaker with a NODE-scoped and a PREFER_NO_SCHEDULE rule; a breaker
floor of 3 with two required tests and two allowed failures).

The seeds are fixed so CI is reproducible; more run locally with
REMEDIATION_MODEL_SEEDS=200 (how many, from 0) or =1000:1200 (a range), and
REMEDIATION_MODEL_STEPS for longer runs.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.fleet.health import policy as service_policy
from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.page_costs import dashboard_query
from tests.support.reports import A100, H100, REGISTER, gpus, node_input

# --- The policy, as remediation.md's table and its policy file say it ---

SEVERITY = ["NONE", "RESTART_APP", "RESET_GPU", "REBOOT_NODE", "CONTACT_SUPPORT"]
OPEN = ("PENDING", "IN_PROGRESS", "AWAITING_VALIDATION")
WITHHOLDING = ("NO_SCHEDULE", "NO_EXECUTE")


@dataclass(frozen=True)
class Rule:
    action: str
    scope: str
    effect: str | None


CATALOG = {
    48: Rule("RESET_GPU", "GPU", "NO_SCHEDULE"),
    63: Rule("NONE", "GPU", None),
    64: Rule("RESET_GPU", "GPU", "NO_SCHEDULE"),
    74: Rule("RESET_GPU", "NVLINK_GROUP", "NO_SCHEDULE"),
    79: Rule("REBOOT_NODE", "GPU", "NO_SCHEDULE"),
    92: Rule("RESET_GPU", "GPU", "NO_SCHEDULE"),
    94: Rule("RESTART_APP", "GPU", None),
    95: Rule("RESET_GPU", "GPU", "NO_SCHEDULE"),
    119: Rule("RESET_GPU", "GPU", "NO_SCHEDULE"),
    120: Rule("RESET_GPU", "GPU", "NO_SCHEDULE"),
}
# XIDs a report carries: the table's, and the application's (13, 31: counted, nothing more).
XIDS = [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 13, 31]
XID_WEIGHTS = [4, 1, 2, 4, 3, 2, 5, 2, 1, 1, 1, 1]


@dataclass(frozen=True)
class PolicyFile:
    text: str
    fraction: Fraction = Fraction("0.10")
    floor: int = 8
    tests: tuple[str, ...] = ("dcgm_diag",)
    allowed_failures: int = 3
    overrides: tuple[tuple[int, Rule], ...] = ()

    def rule(self, xid: int) -> Rule | None:
        rule = dict(self.overrides).get(xid) or CATALOG.get(xid)
        if rule is None or (rule.action == "NONE" and rule.effect is None):
            return None  # the application's, or IGNORE: nothing is acted on
        return rule

    def limit(self, class_total: int) -> int:
        # "fraction times the GPUs of the class in the inventory, rounded
        # down, on the decimal written, and never below floor"
        return max(self.floor, math.floor(self.fraction * class_total))


POLICIES = [
    PolicyFile(""),
    PolicyFile(
        '[breaker]\nfraction = 0.25\nfloor = 2\n[xid.64]\nscope = "NODE"\n'
        '[xid.92]\neffect = "PREFER_NO_SCHEDULE"\n',
        fraction=Fraction("0.25"),
        floor=2,
        overrides=(
            (64, Rule("RESET_GPU", "NODE", "NO_SCHEDULE")),
            (92, Rule("RESET_GPU", "GPU", "PREFER_NO_SCHEDULE")),
        ),
    ),
    PolicyFile(
        "[breaker]\nfloor = 3\n"
        '[validation]\ntests = ["dcgm_diag", "nccl_loopback"]\nallowed_failures = 2\n'
        '[xid.95]\naction = "REBOOT_NODE"\nscope = "NVLINK_GROUP"\n',
        floor=3,
        tests=("dcgm_diag", "nccl_loopback"),
        allowed_failures=2,
        overrides=((95, Rule("REBOOT_NODE", "NVLINK_GROUP", "NO_SCHEDULE")),),
    ),
]

# --- The cluster ---


@dataclass(frozen=True)
class NodeSpec:
    id: str
    model: dict[str, Any]
    gpu_class: str
    groups: tuple[range, ...] | None  # None: topology unknown

    def group_of(self, index: int) -> range | None:
        return next((g for g in self.groups or () if index in g), None)


NODES = (
    NodeSpec("h1", H100, "H100-80GB", None),
    NodeSpec("h2", H100, "H100-80GB", (range(0, 8),)),
    NodeSpec("a1", A100, "A100-40GB", (range(0, 4), range(4, 8))),
)
SPEC = {n.id: n for n in NODES}
CLASS_TOTAL = {"H100-80GB": 16, "A100-40GB": 8}

# --- The model's state ---

Place = tuple[str, int | None]  # (node, GPU index; None: the node itself)


@dataclass
class Fault:
    trigger: str
    gpus: tuple[int, ...]
    key: str | None  # the taint it put, or None
    on_node: bool


@dataclass
class Remediation:
    id: int
    node: str
    gpus: tuple[int, ...]
    gpu_class: str
    action: str
    state: str
    trigger: str
    taint_key: str | None
    faults: list[Fault]
    failures: int = 0
    passed: set[str] = field(default_factory=set)  # required tests passed since it waits


@dataclass
class Model:
    policy: PolicyFile
    boots: dict[str, int] = field(default_factory=lambda: {n.id: 0 for n in NODES})
    sticky: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    taints: dict[Place, dict[str, tuple[str, str]]] = field(default_factory=dict)
    remediations: list[Remediation] = field(default_factory=list)
    # GPUs the policy tainted "in the last hour" (the whole run), per class.
    counted: dict[str, set[tuple[str, int]]] = field(default_factory=dict)

    def open_on(self, node: str, indices: set[int]) -> list[Remediation]:
        return [
            r
            for r in self.remediations
            if r.node == node and r.state in OPEN and indices & set(r.gpus)
        ]

    def put(self, place: Place, key: str, effect: str, source: str) -> None:
        self.taints.setdefault(place, {})[key] = (effect, source)

    def lift(self, place: Place, key: str) -> None:
        self.taints.get(place, {}).pop(key, None)

    def concerns(self, node: str, rule: Rule, index: int) -> list[int]:
        """The GPUs of the rule's scope: the GPU, every GPU of its NVLink group, the node's."""
        if rule.scope == "NODE":
            return list(range(8))
        if rule.scope == "NVLINK_GROUP":
            group = SPEC[node].group_of(index)
            return list(group) if group is not None else [index]
        return [index]

    # "A fault on GPUs that already have a remediation"
    def fault(self, node: str, index: int, xid: int) -> None:
        rule = self.policy.rule(xid)
        if rule is None:
            return
        trigger = f"xid-{xid}"
        concern = self.concerns(node, rule, index)
        joined = self.open_on(node, set(concern))
        parts: list[tuple[Remediation | None, list[int]]] = [
            (r, [i for i in concern if i in r.gpus]) for r in joined
        ]
        rest = [i for i in concern if not any(i in r.gpus for r in joined)]
        if rest:
            parts.append((None, rest))
        suppressed_at_fault = False
        for r, part in parts:
            escalated = r is None and any(
                o.node == node and o.state in ("DONE", "ESCALATED") and set(o.gpus) & set(part)
                for o in self.remediations
            )
            effect = rule.effect
            if escalated and effect in (None, "PREFER_NO_SCHEDULE"):
                effect = "NO_SCHEDULE"  # "its own taint at least NO_SCHEDULE"
            places: list[Place] = (
                [(node, None)] if rule.scope == "NODE" else [(node, i) for i in part]
            )
            in_place = effect is not None and all(
                self.taints.get(p, {}).get(trigger, ("",))[0] == effect for p in places
            )
            suppressed = False
            gpu_class = SPEC[node].gpu_class
            counted = self.counted.setdefault(gpu_class, set())
            if effect is not None and not in_place:
                taking = {(node, i) for i in part} - counted
                suppressed = len(counted) + len(taking) > self.policy.limit(CLASS_TOTAL[gpu_class])
            key = trigger if effect is not None and not suppressed else None
            if r is None:
                action, state = rule.action, "PENDING"
                if escalated:
                    action, state = "CONTACT_SUPPORT", "ESCALATED"
                if suppressed:
                    state = "SUPPRESSED"
                self.remediations.append(
                    Remediation(
                        id=len(self.remediations) + 1,
                        node=node,
                        gpus=tuple(part),
                        gpu_class=gpu_class,
                        action=action,
                        state=state,
                        trigger=trigger,
                        taint_key=key,
                        faults=[Fault(trigger, tuple(part), key, rule.scope == "NODE")],
                    )
                )
            elif not suppressed:
                r.faults.append(Fault(trigger, tuple(part), key, rule.scope == "NODE"))
                r.action = max(r.action, rule.action, key=SEVERITY.index)
                r.taint_key = r.taint_key or key
                if r.state == "AWAITING_VALIDATION" and effect is not None:
                    r.state, r.passed = "PENDING", set()
            if key is not None and effect is not None:
                counted.update((node, i) for i in part)
                for p in places:
                    self.put(p, key, effect, "XID")
            if index in part:
                suppressed_at_fault = suppressed
        # gpus.md: an XID whose rule taints leaves the sticky reason xid_<n>;
        # the breaker section: none when its taint was kept off.
        if rule.effect is not None and not suppressed_at_fault:
            self.sticky.setdefault((node, index), set()).add(f"xid_{xid}")

    def held_sticky(self, node: str, index: int) -> set[str]:
        """The sticky reasons open remediations' faults left on a GPU: a reboot keeps them."""
        return {
            "xid_" + f.trigger.removeprefix("xid-")
            for r in self.open_on(node, {index})
            for f in r.faults
        }

    def carried_out(self, node: str, actions: tuple[str, ...], index: int | None) -> None:
        for r in self.remediations:
            if (
                r.node == node
                and r.state in ("PENDING", "IN_PROGRESS")
                and r.action in actions
                and (index is None or index in r.gpus)
            ):
                self.wait(r)

    def wait(self, r: Remediation) -> None:
        r.state, r.passed = "AWAITING_VALIDATION", set()

    def reboot(self, node: str) -> None:
        self.boots[node] += 1
        self.carried_out(node, ("REBOOT_NODE", "RESET_GPU"), None)
        for i in range(8):
            key = (node, i)
            self.sticky[key] = self.sticky.get(key, set()) & self.held_sticky(node, i)

    def reset_seen(self, node: str, index: int) -> None:
        self.carried_out(node, ("RESET_GPU",), index)
        key = (node, index)
        self.sticky[key] = self.sticky.get(key, set()) & self.held_sticky(node, index)

    def clear_health(self, node: str, index: int) -> None:
        self.sticky[(node, index)] = set()
        self.carried_out(node, ("RESET_GPU",), index)

    def done(self, r: Remediation) -> None:
        r.state = "DONE"
        reasons = {"xid_" + f.trigger.removeprefix("xid-") for f in r.faults}
        for i in r.gpus:
            self.sticky[(r.node, i)] = self.sticky.get((r.node, i), set()) - reasons
        others = [o for o in self.open_on(r.node, set(range(8))) if o is not r]
        for f in r.faults:
            if f.key is None:
                continue
            if f.on_node:
                if not any(g.key == f.key and g.on_node for o in others for g in o.faults):
                    self.lift((r.node, None), f.key)
                continue
            for i in f.gpus:
                if not any(g.key == f.key and i in g.gpus for o in others for g in o.faults):
                    self.lift((r.node, i), f.key)

    def validation(self, node: str, indices: list[int], test: str, passed: bool) -> None:
        waiting = [
            r
            for r in self.remediations
            if r.node == node and r.state == "AWAITING_VALIDATION" and set(indices) & set(r.gpus)
        ]
        if not waiting:
            key = f"validation-{test}"
            for i in indices:
                if passed:
                    self.lift((node, i), key)
                else:
                    self.put((node, i), key, "NO_SCHEDULE", "VALIDATION")
            return
        r = waiting[-1]  # "the newest remediation awaiting validation"
        if passed:
            if set(indices) >= set(r.gpus):
                r.passed.add(test)
                if set(self.policy.tests) <= r.passed:
                    self.done(r)
        else:
            r.failures += 1
            if test in self.policy.tests and r.failures >= self.policy.allowed_failures:
                r.state, r.action = "ESCALATED", "CONTACT_SUPPORT"

    # --- What the API answers, as the model says ---

    def recommended(self, node: str, index: int) -> str:
        actions = ["NONE"]
        for reason in self.sticky.get((node, index), set()):
            rule = self.policy.rule(int(reason.removeprefix("xid_")))
            actions.append(rule.action if rule else "NONE")
        return max(actions, key=SEVERITY.index)

    def taints_of(self, place: Place) -> list[tuple[str, str, str]]:
        return sorted((k, e, s) for k, (e, s) in self.taints.get(place, {}).items())

    def free(self, node: str, index: int) -> bool:
        places = [(node, index), (node, None)]
        withheld = any(e in WITHHOLDING for p in places for e, _ in self.taints.get(p, {}).values())
        return not self.sticky.get((node, index)) and not withheld

    def node_view(self, node: str) -> dict[str, Any]:
        to_run = [
            (test, list(r.gpus), r.id)
            for r in self.remediations
            if r.node == node and r.state == "AWAITING_VALIDATION"
            for test in self.policy.tests
            if test not in r.passed
        ]
        return {
            "taints": self.taints_of((node, None)),
            "gpus": [
                (
                    i,
                    sorted(self.sticky.get((node, i), set())),
                    self.recommended(node, i),
                    self.taints_of((node, i)),
                )
                for i in range(8)
            ],
            "free": [i for i in range(8) if self.free(node, i)],
            "validationsToRun": to_run,
        }

    def remediation_view(self) -> list[tuple[Any, ...]]:
        return [
            (r.id, r.node, list(r.gpus), r.action, r.state, r.trigger, r.taint_key)
            for r in self.remediations
        ]


# --- The service, asked the same ---

_NODE_FIELDS = """
  taints { key effect source }
  gpus { index healthReasons recommendedAction taints { key effect source } }
  freeGpus { index }
  validationsToRun { test gpuIndices remediationId }
"""
VIEW = (
    "{ "
    + " ".join(f'{n.id}: node(id: "{n.id}") {{ {_NODE_FIELDS} }}' for n in NODES)
    + " remediations(first: 1000) { id nodeId gpuIndices action state trigger taintKey } }"
)


def service_view(answer: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    def taints(listed: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
        return sorted((t["key"], t["effect"], t["source"]) for t in listed)

    nodes = {
        n.id: {
            "taints": taints(answer[n.id]["taints"]),
            "gpus": [
                (g["index"], g["healthReasons"], g["recommendedAction"], taints(g["taints"]))
                for g in answer[n.id]["gpus"]
            ],
            "free": [g["index"] for g in answer[n.id]["freeGpus"]],
            "validationsToRun": [
                (v["test"], v["gpuIndices"], int(v["remediationId"]))
                for v in answer[n.id]["validationsToRun"]
            ],
        }
        for n in NODES
    }
    found = [
        (
            int(r["id"]),
            r["nodeId"],
            r["gpuIndices"],
            r["action"],
            r["state"],
            r["trigger"],
            r["taintKey"],
        )
        for r in answer["remediations"]
    ]
    return nodes, found


def report(model: Model, node: str, xids: dict[int, list[int]] | None = None,
           resets: dict[int, str] | None = None) -> dict[str, Any]:  # fmt: skip
    spec = SPEC[node]
    listed = gpus(spec.model)
    for group in spec.groups or ():
        for i in group:
            listed[i]["nvlinkPeers"] = [p for p in group if p != i]
    for i, numbers in (xids or {}).items():
        listed[i]["xids"] = numbers
    for i, seen in (resets or {}).items():
        listed[i]["resetSeen"] = seen
    return {"input": node_input(node, gpus=listed, bootId=f"boot-{model.boots[node]}")}


TAINT = """
mutation T($node: ID!, $indices: [Int!]!, $taint: TaintInput!) {
  taintGpus(nodeId: $node, indices: $indices, taint: $taint) { index }
}
"""
UNTAINT = """
mutation U($node: ID!, $indices: [Int!]!, $key: String!) {
  untaintGpus(nodeId: $node, indices: $indices, key: $key) { index }
}
"""
TAINT_NODE = (
    "mutation T($node: ID!, $taint: TaintInput!) { taintNode(nodeId: $node, taint: $taint) { id } }"
)
UNTAINT_NODE = (
    "mutation U($node: ID!, $key: String!) { untaintNode(nodeId: $node, key: $key) { id } }"
)
START = "mutation S($id: ID!) { startRemediation(id: $id) { id } }"
FINISH = "mutation F($id: ID!, $ok: Boolean!) { finishRemediation(id: $id, succeeded: $ok) { id } }"
VALIDATE = "mutation V($input: ValidationInput!) { recordValidation(input: $input) { id } }"
CLEAR = "mutation C($node: ID!, $index: Int!) { clearGpuHealth(nodeId: $node, index: $index) { index } }"


async def step(api: Api, model: Model, rng: random.Random) -> str:
    """One random step, done to the service and to the model; what it was, for a failure's message."""
    node = rng.choice(NODES).id
    kind = rng.choices(
        ["xids", "reboot", "reset", "clear", "start", "finish", "validate", "taint", "untaint"],
        [34, 7, 6, 3, 9, 9, 20, 6, 6],
    )[0]
    if kind == "xids":
        xids: dict[int, list[int]] = {}
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            xids.setdefault(rng.randrange(8), []).append(rng.choices(XIDS, XID_WEIGHTS)[0])
        rebooted = rng.random() < 0.1
        if rebooted:
            model.reboot(node)
        await api(REGISTER, report(model, node, xids))
        for index in sorted(xids):
            for xid in xids[index]:
                model.fault(node, index, xid)
        return f"{'reboot and ' if rebooted else ''}XIDs {xids} on {node}"
    if kind == "reboot":
        model.reboot(node)
        await api(REGISTER, report(model, node))
        return f"reboot {node}"
    if kind == "reset":
        index = rng.randrange(8)
        await api(REGISTER, report(model, node, resets={index: "the volatile ECC count went down"}))
        model.reset_seen(node, index)
        return f"reset seen on {node} GPU {index}"
    if kind == "clear":
        index = rng.randrange(8)
        await api(CLEAR, {"node": node, "index": index})
        model.clear_health(node, index)
        return f"clearGpuHealth {node} GPU {index}"
    if kind in ("start", "finish"):
        if not model.remediations:
            return "nothing to start or finish"
        wanted = "PENDING" if kind == "start" else "IN_PROGRESS"
        likely = [r for r in model.remediations if r.state == wanted]
        r = rng.choice(likely if likely and rng.random() < 0.85 else model.remediations)
        ok = rng.random() < 0.8
        variables: dict[str, Any] = {"id": str(r.id)} | ({} if kind == "start" else {"ok": ok})
        body = await api.raw(START if kind == "start" else FINISH, variables)
        if r.state != wanted:
            # "A step the state does not allow ... is CONFLICT ...; nothing changes."
            assert body["errors"][0]["extensions"]["code"] == "CONFLICT", body
            return f"{kind} {r.id} ({r.state}): CONFLICT"
        assert not body.get("errors"), body
        if kind == "start":
            r.state = "IN_PROGRESS"
        elif ok:
            model.wait(r)
        else:
            r.state, r.action = "ESCALATED", "CONTACT_SUPPORT"
        return f"{kind} {r.id}{'' if kind == 'start' else f' succeeded={ok}'}"
    if kind == "validate":
        waiting = [r for r in model.remediations if r.state == "AWAITING_VALIDATION"]
        passed = rng.random() < 0.7
        if waiting and rng.random() < 0.7:
            r = rng.choice(waiting)
            node, test = r.node, rng.choice(model.policy.tests)
            indices = list(r.gpus)
            if len(indices) > 1 and rng.random() < 0.2:
                indices = sorted(rng.sample(indices, rng.randrange(1, len(indices))))
        else:
            held = {i for r in waiting if r.node == node for i in r.gpus}
            left = [i for i in range(8) if i not in held]
            if not left:
                return "no GPU to validate"
            indices = sorted(rng.sample(left, rng.randint(1, min(3, len(left)))))
            test = rng.choice(["dcgm_diag", "nccl_loopback"])
        result = {"nodeId": node, "gpuIndices": indices, "test": test, "passed": passed}
        await api(VALIDATE, {"input": result})
        model.validation(node, indices, test, passed)
        return f"{test} {'passed' if passed else 'failed'} on {node} {indices}"
    if kind == "taint":
        key = rng.choice(["maint", "dedicated"])
        effect = rng.choice(["NO_SCHEDULE", "PREFER_NO_SCHEDULE", "NO_EXECUTE"])
        taint = {"key": key, "effect": effect, "reason": "the model's operator"}
        if rng.random() < 0.3:
            await api(TAINT_NODE, {"node": node, "taint": taint})
            model.put((node, None), key, effect, "OPERATOR")
            return f"taintNode {node} {key}:{effect}"
        indices = sorted(rng.sample(range(8), rng.randint(1, 3)))
        await api(TAINT, {"node": node, "indices": indices, "taint": taint})
        for i in indices:
            model.put((node, i), key, effect, "OPERATOR")
        return f"taintGpus {node} {indices} {key}:{effect}"
    # An operator lifts a taint there is, whoever put it (an ESCALATED one's, too).
    present = [(p, k) for p, keys in model.taints.items() if p[0] == node for k in keys]
    if not present:
        return f"no taint on {node} to lift"
    (_, index), key = rng.choice(sorted(present, key=str))
    if index is None:
        await api(UNTAINT_NODE, {"node": node, "key": key})
    else:
        await api(UNTAINT, {"node": node, "indices": [index], "key": key})
    model.lift((node, index), key)
    return f"untaint {node} {'node' if index is None else f'GPU {index}'} {key}"


def recommended_beyond_remediations(
    nodes: dict[str, Any], found: list[tuple[Any, ...]]
) -> list[str]:
    """The GPUs whose sticky faults recommend more than any remediation holding them asks.

    remediation.md: the sticky faults of a GPU never recommend more than the
    action of the remediation that holds them (open, or ESCALATED: a
    person's), so the reset or reboot they need is what finishes it. Checked
    on the service's answers alone.
    """
    beyond = []
    for node, view in nodes.items():
        for index, reasons, recommended, _ in view["gpus"]:
            if not reasons:
                continue
            holding = [
                action
                for _, on, gpus_of, action, state, _, _ in found
                if on == node and index in gpus_of and state in (*OPEN, "ESCALATED")
            ]
            if not any(SEVERITY.index(a) >= SEVERITY.index(recommended) for a in holding):
                beyond.append(f"{node} GPU {index}: {recommended}, remediations {holding}")
    return beyond


def _seeds() -> list[int]:
    given = os.environ.get("REMEDIATION_MODEL_SEEDS")
    if not given:
        return list(range(8))
    if ":" in given:
        start, stop = given.split(":")
        return list(range(int(start), int(stop)))
    return list(range(int(given)))


STEPS = int(os.environ.get("REMEDIATION_MODEL_STEPS", "45"))


@pytest.fixture
def installed() -> Iterator[None]:
    yield
    service_policy.install(service_policy.BUILT_IN)


def dashboard_view(answer: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's node list (its health marks), as the model's node_view and remediations."""

    def taints(listed: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
        return sorted((t["key"], t["effect"], t["source"]) for t in listed)

    return {
        n["id"]: (
            taints(n["taints"]),
            [
                (g["index"], g["healthReasons"], g["recommendedAction"], taints(g["taints"]))
                for g in n["gpus"]
            ],
            [
                (int(r["id"]), r["gpuIndices"], r["action"], r["state"], r["trigger"])
                for r in n["remediations"]
            ],
        )
        for n in answer["nodes"]
    }


def modelled_dashboard(model: Model) -> dict[str, Any]:
    return {
        n.id: (
            model.node_view(n.id)["taints"],
            model.node_view(n.id)["gpus"],
            [
                (r.id, list(r.gpus), r.action, r.state, r.trigger)
                for r in model.remediations
                if r.node == n.id and r.state in OPEN
            ],
        )
        for n in NODES
    }


@pytest.mark.seeds(_seeds())
async def test_the_service_does_what_the_docs_say(
    api: Api,
    engine: AsyncEngine,
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    installed: None,
    seed: int,
) -> None:
    rng = random.Random(seed)
    chosen = POLICIES[seed % len(POLICIES)]
    service_policy.install(service_policy.parse(chosen.text))
    model = Model(chosen)
    for n in NODES:
        await api(REGISTER, report(model, n.id))
    history: list[str] = []
    for number in range(STEPS):
        history.append(await step(api, model, rng))
        nodes, found = service_view(await api(VIEW))
        said = f"seed {seed}, step {number}; the steps:\n  " + "\n  ".join(history)
        assert found == model.remediation_view(), said
        for n in NODES:
            assert nodes[n.id] == model.node_view(n.id), f"node {n.id}, {said}"
        assert recommended_beyond_remediations(nodes, found) == [], said
    # The dashboard's node list, built by PostgreSQL (the compiled page) and by
    # Strawberry's resolvers: the same, and what the model says.
    page = dashboard_query("NODES_QUERY")
    compiled, reference = [await Api(c)(page, {"after": None}) for c in both]
    assert compiled == reference
    assert dashboard_view(compiled) == modelled_dashboard(model), f"seed {seed}"
    assert await inconsistencies(engine) == []
