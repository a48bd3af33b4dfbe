"""A node's states, the reason shown with each and their wording have one home (service/node_states.py).

Two ways this can go wrong, and a test for each:
- a second definition appears elsewhere and the two drift (the source scan
  below names the file and the line);
- an answer stops following the definition: on a database holding every
  state (and a cordoned node that went unreachable), the SQL and Python forms
  of the reason rule are compared, and the answers that show or word a state
  (Node.stateReason and stateChangedBy, a placement verdict, an allocation's
  refusal) are checked against them.
"""

from __future__ import annotations

import re

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service import node_states
from service.scheduling.gpu_pools import refresh_pools
from tests.support.api import Api
from tests.support.one_definition import PYTHON_AND_DASHBOARD, ROOT, second_definitions
from tests.support.reports import (
    ALLOCATE,
    EXPLAIN,
    REGISTER,
    allocation,
    node_input,
    placement,
    shard,
)

HOME = ROOT / "service" / "node_states.py"

# What a second definition looks like, in SQL, Python or the dashboard's JS.
SECOND_DEFINITIONS = {
    "a list of the states": re.compile(r"""(['"])ready\1\s*,\s*(['"])cordoned\2""", re.I),
    "a state enum": re.compile(r"""\bCORDONED\s*=\s*(['"])cordoned\1"""),
    "a CHECK of the state columns": re.compile(r"\b(admin_state|liveness)\s+IN\s*\(", re.I),
    "the state's derivation": re.compile(r"WHEN\s+admin_state\s+IS\s+NOT\s+NULL", re.I),
    "the reason rule": re.compile(
        r"""\bin\s*\(\s*(['"])unreachable\1\s*,\s*(['"])lost\2|THEN\s+\w+\.liveness_reason\b"""
        r"|\bliveness_reason\s+if\b",
        re.I,
    ),
    "the state's wording": re.compile(r"""\{[\w.]*state\}:\s*\{"""),
}

# Lines that match a pattern but define nothing: (file, text on the line) -> why.
NOT_DEFINITIONS = {
    ("service/static/dashboard.js", 'const STATES = ["READY", "CORDONED", "DRAINING",'): (
        "the filter's options: a client of the GraphQL enum NodeState, as schedulers are"
    ),
}


def test_node_states_are_defined_in_one_place() -> None:
    found = second_definitions(
        HOME, SECOND_DEFINITIONS, kinds=PYTHON_AND_DASHBOARD, excused=NOT_DEFINITIONS
    )
    assert not found, "define it in service/node_states.py and use it from there:\n" + "\n".join(
        found
    )


def test_the_scan_would_see_the_definitions_it_forbids() -> None:
    # The forms the rules were once written in elsewhere (node_reads.STATES,
    # the GraphQL enum, tables.py's CHECKs and computed column, the SQL CASEs
    # of placement and json_pages, allocations.state_phrase, verdicts.judge),
    # so the scan above cannot pass by matching nothing.
    old_forms = {
        "a list of the states": ['STATES = ("ready", "cordoned", "draining")'],
        "a state enum": ['    CORDONED = "cordoned"'],
        "a CHECK of the state columns": [
            "CheckConstraint(\"admin_state IN ('cordoned', 'draining')\"",
            "\"liveness IN ('alive', 'unreachable', 'lost')\"",
        ],
        "the state's derivation": ['"WHEN admin_state IS NOT NULL THEN admin_state"'],
        "the reason rule": [
            "CASE WHEN n.state IN ('unreachable', 'lost') THEN n.liveness_reason",
            'if state in ("unreachable", "lost"):',
            "reason = liveness_reason if state in bad else admin_reason",
        ],
        "the state's wording": ['f"{node.state}: {node.state_reason}"', 'f"{state}: {reason}"'],
    }
    for what, lines in old_forms.items():
        for line in lines:
            assert SECOND_DEFINITIONS[what].search(line), (what, line)
    # And they match the definitions themselves, so a copy of one is caught.
    home = HOME.read_text()
    generated = {
        "a list of the states": repr(node_states.STATES),
        "a state enum": home,
        "a CHECK of the state columns": node_states.ADMIN_STATE_CHECK + node_states.LIVENESS_CHECK,
        "the state's derivation": node_states.STATE_SQL,
        "the reason rule": node_states.state_reason_sql("n"),
        "the state's wording": home,
    }
    for what, pattern in SECOND_DEFINITIONS.items():
        assert pattern.search(generated[what]), what


WHY = {"cordoned": "fan", "draining": "kernel", "unreachable": "no heartbeat", "lost": "gone"}


async def every_state(api: Api, engine: AsyncEngine) -> None:
    """A node in each state; the unreachable and lost ones were cordoned first."""
    for node in ("ready-1", "cordoned-1", "draining-1", "unreachable-1", "lost-1"):
        await api(REGISTER, {"input": node_input(node)})
    await api('mutation { cordonNode(id: "cordoned-1", reason: "fan") { id } }')
    await api('mutation { drainNode(id: "draining-1", reason: "kernel") { id } }')
    for node in ("unreachable-1", "lost-1"):
        await api(f'mutation {{ cordonNode(id: "{node}", reason: "fan") {{ id }} }}')
    async with engine.begin() as conn:
        # Who cordoned: shown while cordoned or draining, not under a liveness problem.
        await conn.execute(
            text("UPDATE nodes SET admin_actor = 'ops' WHERE admin_state IS NOT NULL")
        )
        for state in ("unreachable", "lost"):
            await conn.execute(
                text("UPDATE nodes SET liveness = :state, liveness_reason = :why WHERE id = :id"),
                {"state": state, "why": WHY[state], "id": f"{state}-1"},
            )
        await refresh_pools(conn, ["unreachable-1", "lost-1"])


async def test_the_sql_and_python_reason_rules_agree_on_every_state(
    api: Api, engine: AsyncEngine
) -> None:
    await every_state(api, engine)
    async with engine.connect() as conn:
        rows = list(
            await conn.execute(
                text(
                    "SELECT n.id, n.state, n.admin_reason, n.admin_actor, n.liveness_reason,"
                    f" {node_states.state_reason_sql('n')} AS reason,"
                    f" {node_states.state_actor_sql('n')} AS actor FROM nodes n"
                )
            )
        )
    assert sorted(r.state for r in rows) == sorted(node_states.STATES)
    for r in rows:
        python = node_states.shown_reason(r.state, r.admin_reason, r.admin_actor, r.liveness_reason)
        assert (r.reason, r.actor) == python, r.id
        assert r.reason == WHY.get(r.state), r.id
    assert {r.state for r in rows if r.actor is not None} == {"cordoned", "draining"}


async def test_every_answer_shows_and_words_the_reason_that_explains_the_state(
    api: Api, engine: AsyncEngine
) -> None:
    await every_state(api, engine)

    # Node.stateReason and stateChangedBy, on a page and for one node: the
    # operator's cordon stays remembered under the liveness problem.
    page = (await api("{ nodes { id state stateReason stateChangedBy } }"))["nodes"]
    shown = {n["id"]: (n["state"], n["stateReason"], n["stateChangedBy"]) for n in page}
    assert shown == {
        "ready-1": ("READY", None, None),
        "cordoned-1": ("CORDONED", "fan", "ops"),
        "draining-1": ("DRAINING", "kernel", "ops"),
        "unreachable-1": ("UNREACHABLE", "no heartbeat", None),
        "lost-1": ("LOST", "gone", None),
    }
    for node_id, answer in shown.items():
        one = await api(f'{{ node(id: "{node_id}") {{ state stateReason stateChangedBy }} }}')
        assert tuple(one["node"].values()) == answer

    # A placement verdict and an allocation's refusal word a state the same way.
    explained = (await api(EXPLAIN, placement("r", gpusPerShard=1)))["explainPlacement"]
    details = {v["nodeId"]: v["detail"] for v in explained["verdicts"]}
    for node_id, (state, reason, _) in shown.items():
        if state == "READY":
            continue
        phrase = f"{state.lower()}: {reason}"
        assert phrase in details[node_id], details[node_id]
        refused = (await api(ALLOCATE, allocation(f"r-{node_id}", shard("s", node_id, 0))))[
            "allocate"
        ]
        assert refused["code"] == "NODE_NOT_SCHEDULABLE"
        assert f"is {phrase};" in refused["message"], refused["message"]
