"""'A GPU is free' and 'a node is schedulable' have one definition (service/scheduling/availability.py).

Two ways this can go wrong, and a test for each:
- a second definition appears somewhere else and the two drift (the source
  scan below names the file and the line);
- some answer (freeGpus, Node.freeGpus, the pools, gpuClasses, the nodes
  filter, explainPlacement, place) stops following the definition: on a
  database that holds every case, each answer is compared with what the SQL
  definition selects, and the Python predicates with the SQL ones.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.fleet.node_details import gpus_of
from service.scheduling import availability
from service.scheduling.gpu_pools import refresh_pools
from tests.support.api import Api
from tests.support.consistency import inconsistencies
from tests.support.holds import hold
from tests.support.one_definition import PYTHON_AND_DASHBOARD, ROOT, second_definitions
from tests.support.reports import EXPLAIN, L40S, PLACE, REGISTER, gpus, node_input

HOME = ROOT / "service" / "scheduling" / "availability.py"

# What a second definition looks like, in SQL, Python or the dashboard's JS.
SECOND_DEFINITIONS = {
    "a schedulable state": re.compile(
        r"""state\s*(=|==|!=|<>|===|!==)\s*(\\?['"])(ready|READY)\2"""
    ),
    "a SQL health test": re.compile(r"\b(WHERE|AND|OR|NOT)\s+\(*\w+\.healthy\b(?!\s*=)", re.I),
    "a Python health test": re.compile(r"\b(if|and|or|not)\s+\w+(\[\"healthy\"\]|\.healthy\b)"),
    "a JS health test": re.compile(r"\.healthy\s*&&|&&\s*\w+\.healthy\b"),
    "an allocation probe": re.compile(
        r"NOT\s+\(?\s*EXISTS\s*\(\s*SELECT\s+1\s+FROM\s+allocated_gpus"
    ),
    "the pools' offer": re.compile(r"schedulable\s+AND\s+\w*\.?free\s*>\s*0"),
}

# Lines that match a pattern but define nothing: (file, text on the line) -> why.
NOT_DEFINITIONS = {
    ("service/ctl/gpu_verbs.py", 'health = "healthy" if gpu["healthy"] else'): (
        "shows a GPU's health, decides nothing"
    ),
    ("service/fleet/report_rows.py", 'if g.healthy else ["unhealthy"]'): (
        "a report's reasons: a GPU reported unhealthy without one still says so"
    ),
    (
        "service/ctl/nodes.py",
        '"ok" if gpu["healthy"] else',
    ): "shows a GPU's health, decides nothing",
    ("service/static/dashboard.js", 'const kinds = [!g.healthy && "unhealthy"'): (
        "marks a GPU the service answered unhealthy, decides nothing"
    ),
    ("service/fleet/reports.py", "if gpu.healthy and gpu.health_reasons:"): (
        "refuses a report that contradicts itself, decides no GPU's health"
    ),
    ("service/scheduling/weights_lifecycle.py", "return f\"({alias}.state = 'ready')\""): (
        "a weights row's READY state (weights' one home), not a node's"
    ),
    ("service/scheduling/weights_lifecycle.py", "WHEN {alias}.state = 'ready' THEN 0"): (
        "a weights row's rank by its state (weights' one home), not a node's"
    ),
}


def test_free_and_schedulable_are_defined_in_one_place() -> None:
    found = second_definitions(
        HOME, SECOND_DEFINITIONS, kinds=PYTHON_AND_DASHBOARD, excused=NOT_DEFINITIONS
    )
    assert not found, (
        "define it in service/scheduling/availability.py and use it from there:\n"
        + "\n".join(found)
    )


def test_the_scan_would_see_the_definitions_it_forbids() -> None:
    # The patterns match the forms the rules were once written in elsewhere,
    # so the scan above cannot pass by matching nothing.
    old_forms = {
        "a schedulable state": ["n.state = 'ready'", 'node.state != "ready"', 'state === "READY"'],
        "a SQL health test": ["WHERE g.node_id = :n AND g.healthy", "NOT g.healthy OR x"],
        "a Python health test": ["if g.healthy", 'if gpu["healthy"] and x'],
        "a JS health test": ["if (gpu.healthy && !gpu.allocation)"],
        "an allocation probe": [
            "AND NOT EXISTS (SELECT 1 FROM allocated_gpus a",
            "AND NOT (EXISTS (SELECT 1 FROM allocated_gpus a",
        ],
        "the pools' offer": ["p.schedulable AND p.free > 0", "schedulable AND free > 0"],
    }
    for what, lines in old_forms.items():
        for line in lines:
            assert SECOND_DEFINITIONS[what].search(line), (what, line)
    # And they match the definitions themselves, so a copy of one is caught.
    assert SECOND_DEFINITIONS["a schedulable state"].search(availability.node_schedulable("n"))
    assert SECOND_DEFINITIONS["a SQL health test"].search(f"WHERE {availability.gpu_free('g')}")
    assert SECOND_DEFINITIONS["an allocation probe"].search(availability.gpu_free("g"))
    assert SECOND_DEFINITIONS["the pools' offer"].search(availability.pool_offers("p"))


async def every_case(api: Api, engine: AsyncEngine) -> None:
    """Nodes and GPUs in each state that bears on the definitions."""
    sick = gpus(L40S, 8)
    sick[2] = {**sick[2], "healthy": False, "healthReasons": ["ecc_uncorrected"]}
    sick[3] = {**sick[3], "healthy": False, "healthReasons": ["ecc_uncorrected"]}
    await api(REGISTER, {"input": node_input("ready-1", gpus=sick)})
    await hold(engine, "ready-1", [0, 1, 3], shard="held-1")  # 3 is held and unhealthy
    mixed = [*gpus(L40S, 4), *[{**g, "index": g["index"] + 4} for g in gpus(L40S, 2)]]
    mixed[5] = {**mixed[5], "name": "NVIDIA A100-SXM4-40GB", "memoryMb": 40960}
    await api(REGISTER, {"input": node_input("ready-2", gpus=mixed)})
    for node in ("cordoned-1", "draining-1", "unreachable-1"):
        await api(REGISTER, {"input": node_input(node, gpus=gpus(L40S, 4))})
    await hold(engine, "cordoned-1", [0], shard="held-2")
    await api('mutation { cordonNode(id: "cordoned-1", reason: "fan") { id } }')
    await api('mutation { drainNode(id: "draining-1", reason: "kernel") { id } }')
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE nodes SET liveness = 'unreachable' WHERE id = 'unreachable-1'")
        )
        await refresh_pools(conn, ["unreachable-1"])


async def definitions(engine: AsyncEngine) -> tuple[dict[str, bool], dict[tuple[str, int], bool]]:
    """(node -> schedulable, (node, index) -> free), as the SQL definitions select them."""
    async with engine.connect() as conn:
        nodes = {
            r.id: r.schedulable
            for r in await conn.execute(
                text(
                    f"SELECT n.id, {availability.node_schedulable('n')} AS schedulable FROM nodes n"
                )
            )
        }
        free = {
            (r.node_id, r.idx): r.free
            for r in await conn.execute(
                text(f"SELECT g.node_id, g.idx, {availability.gpu_free('g')} AS free FROM gpus g")
            )
        }
    return nodes, free


async def test_python_predicates_agree_with_the_sql(api: Api, engine: AsyncEngine) -> None:
    await every_case(api, engine)
    schedulable, free = await definitions(engine)
    assert set(schedulable.values()) == {True, False} and set(free.values()) == {True, False}
    async with engine.connect() as conn:
        states = {r.id: r.state for r in await conn.execute(text("SELECT id, state FROM nodes"))}
        records = await gpus_of(conn, list(states))
    assert {n: availability.is_schedulable(s) for n, s in states.items()} == schedulable
    assert {
        (g.node_id, g.index): availability.is_free(g) for gs in records.values() for g in gs
    } == free


async def test_every_answer_follows_the_definitions(api: Api, engine: AsyncEngine) -> None:
    await every_case(api, engine)
    schedulable, free = await definitions(engine)
    offered = {k for k, f in free.items() if f and schedulable[k[0]]}
    assert offered  # the scene has free GPUs on schedulable nodes, and others
    async with engine.connect() as conn:
        classes = {
            (r.node_id, r.idx): r.gpu_class
            for r in await conn.execute(text("SELECT node_id, idx, gpu_class FROM gpus"))
        }

    # The scheduler's question.
    entries = (await api("{ freeGpus(minFree: 1) { node { id } gpuIndices } }"))["freeGpus"]
    assert {(e["node"]["id"], i) for e in entries for i in e["gpuIndices"]} == offered

    # A node's own free GPUs, whatever its state.
    nodes = (await api("{ nodes { id schedulable freeGpus { index } } }"))["nodes"]
    assert {(n["id"], g["index"]) for n in nodes for g in n["freeGpus"]} == {
        k for k, f in free.items() if f
    }
    assert {n["id"]: n["schedulable"] for n in nodes} == schedulable
    for wanted in (True, False):
        page = await api(
            "query($s: Boolean) { nodes(filter: {schedulable: $s}) { id } }", {"s": wanted}
        )
        assert {n["id"] for n in page["nodes"]} == {
            n for n, s in schedulable.items() if s is wanted
        }

    # The pools and the per-class summary.
    assert await inconsistencies(engine) == []
    summary = (await api("{ gpuClasses { gpuClass free unschedulable } }"))["gpuClasses"]
    spare = {k for k, f in free.items() if f and not schedulable[k[0]]}
    assert {s["gpuClass"]: (s["free"], s["unschedulable"]) for s in summary} == {
        cls: (
            Counter(classes[k] for k in offered)[cls],
            Counter(classes[k] for k in spare)[cls],
        )
        for cls in set(classes.values())
    }

    # Placement's explanation counts the same free GPUs per node...
    explained = await api(
        EXPLAIN, {"input": {"replicaId": "r", "gpuClass": "L40S-48GB", "gpusPerShard": 1}}
    )
    per_node = Counter(n for (n, _) in offered if classes[(n, _)] == "L40S-48GB")
    fits = {
        v["nodeId"]: int(v["detail"].split()[0])
        for v in explained["explainPlacement"]["verdicts"]
        if v["code"] == "FITS"
    }
    assert fits == dict(per_node)

    # ... and place() hands out exactly those GPUs, then finds no room.
    placed: dict[str, set[int]] = defaultdict(set)
    for attempt in range(len(offered) + 1):
        answer = (
            await api(
                PLACE,
                {
                    "input": {
                        "replicaId": f"place-{attempt}",
                        "gpuClass": "L40S-48GB",
                        "gpusPerShard": 1,
                    }
                },
            )
        )["place"]
        if answer["__typename"] != "Allocated":
            assert answer["__typename"] == "Unplaceable", answer
            break
        for shard in answer["allocations"]:
            placed[shard["nodeId"]].update(shard["gpuIndices"])
    assert {(n, i) for n, indices in placed.items() for i in indices} == {
        k for k in offered if classes[k] == "L40S-48GB"
    }
    assert await inconsistencies(engine) == []
