"""Drift: where a node differs from what its hardware profile says it should have.

An operator describes what a kind of node should have (setHardwareProfile:
GPU count and class, HCA count and rate, NVLink group size, memory) and the
label that picks its nodes. Each stored report of such a node is compared
with it; every difference is a finding (Node.drift: GPU_MISSING,
GPU_CLASS_CHANGED, HCA_MISSING, HCA_RATE_LOW, NVLINK_DEGRADED, MEMORY_LOW),
an event when it appears (drift_found) and when it clears (drift_cleared).
A new finding is a remediation of the policy's rule for its kind
(policy.DRIFT_RULES) through the circuit breaker, as an XID's is, whose
taint (source DRIFT, key drift-<kind>) goes on the smallest scope that
explains it:

- a rail whose HCA runs below its rate: the GPUs of that rail (their
  near_hcas), so multi-node shapes avoid them while the node's other GPUs
  still serve;
- an NVLink group smaller than the profile's: the GPUs of that group;
- a GPU whose class is not the profile's: that GPU;
- a missing GPU, a missing HCA (which rail is unknown), low memory: the
  node (a shape that needs its full NVLink group cannot run there).

A rule of scope NODE taints the node whatever the finding; effect none
records the finding and taints nothing. A report that shows the node as its
profile says again clears the finding, ends its remediation DONE and lifts
its taint (drift_changes.py: what each change does).

Unknown is not drift: a node whose agent was not asked to look for HCAs
(NodeInput.hcaDiscovery NOT_ASKED; an agent that does not say and reports
none) is not HCA_MISSING (hcas_known), GPUs whose NVLink
peers are unknown are not NVLINK_DEGRADED, an unreported memory size is not
MEMORY_LOW. A node several profiles select is compared with the first by name.

Runs in the transaction that stored the report (or changed the profile), the
node's row locked, as every writer of its taints locks it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Row

from service.bounds import MAX_ID_LENGTH
from service.database.connections import Connection
from service.errors import InvalidInput
from service.event_log.events import record_event
from service.fleet.health.drift_changes import Finding as Finding
from service.fleet.health.drift_changes import FindingChange
from service.fleet.health.policy import DriftKind, current
from service.fleet.reports import HcaDiscovery
from service.scheduling.rejections import index_ranges
from service.stored_text import id_problem

# Profile fields that are counts or sizes, by their GraphQL input name.
_LIMITS = {
    "gpuCount": 64 * 16,
    "hcaCount": 1024,
    "hcaRateGbps": 100_000,
    "nvlinkGroupSize": 64 * 16,
    "memoryTotalMb": (1 << 31) - 1,
}


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    selector: tuple[str, str]
    gpu_count: int | None = None
    gpu_class: str | None = None
    hca_count: int | None = None
    hca_rate_gbps: int | None = None
    nvlink_group_size: int | None = None
    memory_total_mb: int | None = None


def check_profile(profile: HardwareProfile) -> None:
    """BAD_INPUT naming the field; nothing is stored for a refused profile."""
    for field, value in (
        ("input.name", profile.name),
        ("input.selector.key", profile.selector[0]),
        ("input.selector.value", profile.selector[1]),
    ):
        if not value.strip() or id_problem(value) is not None:
            raise InvalidInput(field, value, f"1 to {MAX_ID_LENGTH} characters, not blank")
    if profile.gpu_class is not None and (
        not profile.gpu_class.strip() or len(profile.gpu_class) > MAX_ID_LENGTH
    ):
        raise InvalidInput("input.gpuClass", profile.gpu_class, "a GPU class, e.g. H100-80GB")
    counts: tuple[tuple[str, int | None], ...] = (
        ("gpuCount", profile.gpu_count),
        ("hcaCount", profile.hca_count),
        ("hcaRateGbps", profile.hca_rate_gbps),
        ("nvlinkGroupSize", profile.nvlink_group_size),
        ("memoryTotalMb", profile.memory_total_mb),
    )
    for name, count in counts:
        if count is not None and not 1 <= count <= _LIMITS[name]:
            raise InvalidInput(f"input.{name}", count, f"between 1 and {_LIMITS[name]:,}")
    if (
        profile.nvlink_group_size is not None
        and profile.gpu_count is not None
        and profile.nvlink_group_size > profile.gpu_count
    ):
        raise InvalidInput(
            "input.nvlinkGroupSize",
            profile.nvlink_group_size,
            f"larger than the profile's gpuCount {profile.gpu_count}",
        )


def _gb(rate: int) -> str:
    return f"{rate} Gb/s"


def _names(hcas: Sequence[str]) -> str:
    return ", ".join(sorted(hcas))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def hcas_known(hcas: int, discovery: str | None) -> bool:
    """Whether a report's HCAs can be compared with a profile's count (unknown is not drift).

    The agent says whether it looked (reports.HcaDiscovery): it looked, or was
    configured to and the kernel shows no InfiniBand, and every adapter it
    did not report is missing; it was not asked, and none is known. An agent
    that does not say (older than the field) counts as having looked only
    when it reports at least one adapter: it reports none when it was not
    asked, which must not read as all missing.
    """
    if discovery is None:
        return hcas > 0
    return discovery != HcaDiscovery.NOT_ASKED.value


def findings(
    profile: HardwareProfile,
    gpus: Sequence[Row[Any]],
    fabrics: Sequence[Row[Any]],
    memory_total_mb: int | None,
    hca_discovery: str | None = None,
) -> dict[DriftKind, Finding]:
    """What differs between a node's stored report and its profile (pure: the one definition)."""
    out: dict[DriftKind, Finding] = {}

    def found(kind: DriftKind, expected: str, observed: str, on: Sequence[int] | None) -> None:
        out[kind] = Finding(kind, expected, observed, None if on is None else tuple(sorted(on)))

    if profile.gpu_count is not None and len(gpus) < profile.gpu_count:
        found(
            DriftKind.GPU_MISSING,
            _count(profile.gpu_count, "GPU"),
            _count(len(gpus), "GPU"),
            None,
        )
    if profile.gpu_class is not None:
        other = [g for g in gpus if g.gpu_class != profile.gpu_class]
        if other:
            classes = ", ".join(sorted({g.gpu_class for g in other}))
            observed = f"{classes} on GPU {index_ranges(g.idx for g in other)}"
            found(DriftKind.GPU_CLASS_CHANGED, profile.gpu_class, observed, [g.idx for g in other])
    hcas = {hca for f in fabrics for hca in f.hcas}
    if (
        profile.hca_count is not None
        and hcas_known(len(hcas), hca_discovery)
        and len(hcas) < profile.hca_count
    ):
        observed = _count(len(hcas), "HCA")
        if hca_discovery == HcaDiscovery.NO_INFINIBAND.value:
            observed += " (no /sys/class/infiniband: no InfiniBand driver or adapter)"
        found(DriftKind.HCA_MISSING, _count(profile.hca_count, "HCA"), observed, None)
    if profile.hca_rate_gbps is not None:
        slow = [f for f in fabrics if f.rate_gbps < profile.hca_rate_gbps]
        if slow:
            slow_hcas = {hca for f in slow for hca in f.hcas}
            # Each slow rail as a person reads it, in the fabrics' order
            # (_FABRICS sorts them): a report, not a choice between fabrics.
            observed = "; ".join(
                f"{_names(f.hcas)} ({f.fabric}) at {_gb(f.rate_gbps)}" for f in slow
            )
            # The rail: the GPUs whose near HCAs run slow; unknown rails, the node.
            rail = [g.idx for g in gpus if set(g.near_hcas or ()) & slow_hcas]
            found(DriftKind.HCA_RATE_LOW, _gb(profile.hca_rate_gbps), observed, rail or None)
    if profile.nvlink_group_size is not None:
        sizes = Counter(g.nvlink_group for g in gpus if g.nvlink_group is not None)
        small = sorted(group for group, size in sizes.items() if size < profile.nvlink_group_size)
        if small:
            on = [g.idx for g in gpus if g.nvlink_group in small]
            observed = ", ".join(f"{sizes[group]} at GPU {group}" for group in small)
            found(
                DriftKind.NVLINK_DEGRADED,
                f"NVLink groups of {profile.nvlink_group_size}",
                f"groups of {observed}",
                on,
            )
    if (
        profile.memory_total_mb is not None
        and memory_total_mb is not None
        and memory_total_mb < profile.memory_total_mb
    ):
        found(
            DriftKind.MEMORY_LOW,
            f"{profile.memory_total_mb} MB",
            f"{memory_total_mb} MB",
            None,
        )
    return out


_PROFILES = text(
    """
    SELECT n.id AS node_id, n.memory_total_mb, n.hca_discovery, p.name, p.selector_key, p.selector_value,
           p.gpu_count, p.gpu_class, p.hca_count, p.hca_rate_gbps, p.nvlink_group_size,
           p.memory_total_mb AS profile_memory,
           EXISTS (SELECT 1 FROM drift_findings f WHERE f.node_id = n.id) AS drifted
    FROM nodes n
    LEFT JOIN LATERAL (
        SELECT * FROM hardware_profiles p
        WHERE n.labels ->> p.selector_key = p.selector_value
        ORDER BY p.name LIMIT 1
    ) p ON true
    WHERE n.id = ANY(CAST(:ids AS text[]))
    ORDER BY n.id
    """
)
_GPUS = text(
    """
    SELECT node_id, idx, gpu_class, nvlink_group, near_hcas FROM gpus
    WHERE node_id = ANY(CAST(:ids AS text[])) ORDER BY node_id, idx
    """
)
_FABRICS = text(
    """
    SELECT node_id, fabric, hcas, rate_gbps FROM fabric_attachments
    WHERE node_id = ANY(CAST(:ids AS text[])) ORDER BY node_id, fabric
    """
)
_STORED = text(
    """
    SELECT node_id, kind, expected, observed, gpu_indices, taint_on, tainted, since,
           remediation_id
    FROM drift_findings WHERE node_id = ANY(CAST(:ids AS text[]))
    """
)


def profile_of_row(r: Row[Any]) -> HardwareProfile:
    return HardwareProfile(
        name=r.name,
        selector=(r.selector_key, r.selector_value),
        gpu_count=r.gpu_count,
        gpu_class=r.gpu_class,
        hca_count=r.hca_count,
        hca_rate_gbps=r.hca_rate_gbps,
        nvlink_group_size=r.nvlink_group_size,
        memory_total_mb=r.profile_memory,
    )


async def evaluate(conn: Connection, node_ids: Sequence[str], actor: str | None) -> None:
    """Compare each node (its row locked by this transaction) with its profile; act on the change.

    One statement when no profile selects the nodes and none had drifted:
    the common case, and what every changed report pays.
    """
    ids = list(node_ids)
    nodes = [r for r in await conn.execute(_PROFILES, {"ids": ids}) if r.name or r.drifted]
    if not nodes:
        return
    wanted = [r.node_id for r in nodes]
    gpus: dict[str, list[Row[Any]]] = defaultdict(list)
    for g in await conn.execute(_GPUS, {"ids": wanted}):
        gpus[g.node_id].append(g)
    fabrics: dict[str, list[Row[Any]]] = defaultdict(list)
    for f in await conn.execute(_FABRICS, {"ids": wanted}):
        fabrics[f.node_id].append(f)
    stored: dict[str, dict[str, Row[Any]]] = defaultdict(dict)
    for s in await conn.execute(_STORED, {"ids": wanted}):
        stored[s.node_id][s.kind] = s
    rules = current().drift
    for node in nodes:
        node_gpus = gpus[node.node_id]
        now = (
            {}
            if node.name is None
            else findings(
                profile_of_row(node),
                node_gpus,
                fabrics[node.node_id],
                node.memory_total_mb,
                node.hca_discovery,
            )
        )
        before = stored[node.node_id]
        for kind in DriftKind:
            old, new = before.get(kind.value), now.get(kind)
            change = FindingChange(conn, node.node_id, kind, actor)
            if new is not None and old is None:
                await change.found(new, rules[kind], node_gpus)
            elif new is not None and old is not None:
                await change.persists(old, new, rules[kind], node_gpus)
            elif old is not None:
                await change.cleared(old)


# A node's findings are listed in kind order: Node.drift, read here and
# built by the compiled page (drift_sql).
_ORDER = "kind"
_OF_NODES = text(
    f"""
    SELECT node_id, kind, expected, observed, gpu_indices, since, remediation_id
    FROM drift_findings
    WHERE node_id = ANY(CAST(:ids AS text[])) ORDER BY node_id, {_ORDER}
    """
)


def drift_sql(n: str, entry: str) -> str:
    """SQL json: `entry` (over drift_findings `d`) for each finding of the node row `n`, as
    drift_of lists them; [] for none. The compiled page's Node.drift (service/graphql/fast/json_pages.py)."""
    return (
        f"(SELECT coalesce(json_agg({entry} ORDER BY d.{_ORDER}), '[]')"
        f" FROM drift_findings d WHERE d.node_id = {n}.id)"
    )


async def drift_of(conn: Connection, node_ids: Sequence[str]) -> dict[str, list[Finding]]:
    """Each node's findings (Node.drift), in kind order."""
    out: dict[str, list[Finding]] = defaultdict(list)
    for r in await conn.execute(_OF_NODES, {"ids": list(node_ids)}):
        out[r.node_id].append(
            Finding(
                DriftKind(r.kind),
                r.expected,
                r.observed,
                None if r.gpu_indices is None else tuple(r.gpu_indices),
                r.since,
                r.remediation_id,
            )
        )
    return out


_SET = text(
    """
    INSERT INTO hardware_profiles AS p (name, selector_key, selector_value, gpu_count, gpu_class,
        hca_count, hca_rate_gbps, nvlink_group_size, memory_total_mb, actor)
    VALUES (:name, :key, :value, :gpu_count, :gpu_class, :hca_count, :hca_rate_gbps,
            :nvlink_group_size, :memory_total_mb, :actor)
    ON CONFLICT (name) DO UPDATE SET selector_key = excluded.selector_key,
        selector_value = excluded.selector_value, gpu_count = excluded.gpu_count,
        gpu_class = excluded.gpu_class, hca_count = excluded.hca_count,
        hca_rate_gbps = excluded.hca_rate_gbps, nvlink_group_size = excluded.nvlink_group_size,
        memory_total_mb = excluded.memory_total_mb, actor = excluded.actor, updated_at = now()
    """
)
# The profile's rows serialize its writers; then the nodes either selector
# picks, locked in id order (the order every writer of several nodes uses).
_LOCK_PROFILE = text(
    "SELECT selector_key, selector_value FROM hardware_profiles WHERE name = :name FOR UPDATE"
)
_SELECTED = text(
    """
    SELECT id FROM nodes
    WHERE labels ->> :key = :value OR labels ->> CAST(:old_key AS text) = CAST(:old_value AS text)
    ORDER BY id
    FOR NO KEY UPDATE
    """
)
_LIST = text(
    """
    SELECT name, selector_key, selector_value, gpu_count, gpu_class, hca_count, hca_rate_gbps,
           nvlink_group_size, memory_total_mb AS profile_memory
    FROM hardware_profiles ORDER BY name
    """
)


async def set_profile(conn: Connection, profile: HardwareProfile, actor: str | None) -> None:
    """Create or replace a profile; the nodes it selected or selects now are compared again."""
    check_profile(profile)
    old = (await conn.execute(_LOCK_PROFILE, {"name": profile.name})).one_or_none()
    await conn.execute(
        _SET,
        {
            "name": profile.name,
            "key": profile.selector[0],
            "value": profile.selector[1],
            "gpu_count": profile.gpu_count,
            "gpu_class": profile.gpu_class,
            "hca_count": profile.hca_count,
            "hca_rate_gbps": profile.hca_rate_gbps,
            "nvlink_group_size": profile.nvlink_group_size,
            "memory_total_mb": profile.memory_total_mb,
            "actor": actor,
        },
    )
    await record_event(
        conn,
        "hardware_profile_set",
        actor=actor,
        reason=f"{profile.name}: nodes labelled {profile.selector[0]}={profile.selector[1]}",
        detail={"name": profile.name},
    )
    await _compare_selected(conn, profile.selector, None if old is None else tuple(old), actor)


async def remove_profile(conn: Connection, name: str, actor: str | None) -> bool:
    """Remove a profile (False: there was none); its nodes' drift clears or follows another."""
    old = (await conn.execute(_LOCK_PROFILE, {"name": name})).one_or_none()
    if old is None:
        return False
    await conn.execute(text("DELETE FROM hardware_profiles WHERE name = :name"), {"name": name})
    await record_event(
        conn, "hardware_profile_removed", actor=actor, reason=name, detail={"name": name}
    )
    await _compare_selected(conn, tuple(old), None, actor)
    return True


async def _compare_selected(
    conn: Connection,
    selector: tuple[str, str],
    old: tuple[str, str] | None,
    actor: str | None,
) -> None:
    rows = await conn.execute(
        _SELECTED,
        {
            "key": selector[0],
            "value": selector[1],
            "old_key": None if old is None else old[0],
            "old_value": None if old is None else old[1],
        },
    )
    ids = [r.id for r in rows]
    if ids:
        await evaluate(conn, ids, actor)


async def profiles(conn: Connection) -> list[HardwareProfile]:
    return [profile_of_row(r) for r in await conn.execute(_LIST)]
