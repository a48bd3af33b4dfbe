"""The SQL fragments statements are built from have one home each (issue 45).

"Which taints apply to GPU i of node n" was written out seven times in four
files, "the first withholding taint as JSON" three times in three shapes, the
node facts placement reads four times in one module and re-aliased once; a
rule written twice drifts (one copy is fixed, the other keeps the bug). Each
now has a home, and the source scan below (tests/support/one_definition.py) fails
naming the file and line of a second definition anywhere else under service/.
"""

from __future__ import annotations

import re

from service.scheduling import taints
from service.scheduling.placement import statements
from tests.support.one_definition import ROOT, second_definitions

TAINTS_HOME = ROOT / "service" / "scheduling" / "taints.py"
FACTS_HOME = ROOT / "service" / "scheduling" / "placement" / "statements.py"

TAINT_FRAGMENTS = {
    # taints.taint_applies: a taint on the node applies to each of its GPUs.
    "which taints apply to a GPU": re.compile(r"gpu_index\s+IS\s+NULL\s+OR", re.I),
    # taints.first_taint: the node's own taint first, then by GPU and key.
    "which taint comes first": re.compile(r"gpu_index\s+NULLS\s+FIRST", re.I),
    # taints.taint_json: the one shape a single taint is returned in.
    "a taint as JSON": re.compile(r"'reason',\s*\w+\.reason"),
}
FACT_FRAGMENTS = {
    # statements.node_facts: the facts judge() reads of a node's row.
    # Over a table alias (n.), not a Python object's attributes (self.).
    "the node facts' columns": re.compile(
        r"\b(?!self\.)\w+\.local_disk_free,\s*\w+\.local_disk_total"
    ),
    # statements.disk_fits: unknown disk is not a full disk.
    "the disk check": re.compile(r"local_disk_free\s+IS\s+NULL\s+OR", re.I),
    "the node facts re-aliased": re.compile(
        r"AS\s+picked_(state|local_disk|knows_its|label_value|gpus_facts)"
    ),
}

# Lines that match but define none of these: (file, text on the line) -> why.
NOT_DEFINITIONS = {
    ("service/fleet/node_reads.py", "n.local_disk_free, n.local_disk_total,"): (
        "NODE_COLUMNS: a node's record as the API shows it, not the facts placement judges"
    ),
}


def test_the_taint_fragments_are_defined_in_taints_py() -> None:
    found = second_definitions(TAINTS_HOME, TAINT_FRAGMENTS, excused=NOT_DEFINITIONS)
    assert not found, (
        "use service/scheduling/taints.py's taint_applies, taints_on, first_taint and "
        "taint_json:\n" + "\n".join(found)
    )


def test_the_node_facts_are_listed_in_statements_py() -> None:
    found = second_definitions(FACTS_HOME, FACT_FRAGMENTS, excused=NOT_DEFINITIONS)
    assert not found, "use service/scheduling/placement/statements.py's node_facts:\n" + "\n".join(
        found
    )


def test_the_scan_would_see_the_definitions_it_forbids() -> None:
    # The forms these fragments were written in before they had a home.
    old_forms = {
        "which taints apply to a GPU": [
            "AND (t.gpu_index IS NULL OR t.gpu_index = g.idx) AND t.effect <> {SOFT_EFFECT_SQL}",
            'f" AND (t.gpu_index IS NULL OR t.gpu_index = ANY({p}.withheld_indices))"',
        ],
        "which taint comes first": ["ORDER BY t.gpu_index NULLS FIRST, t.key LIMIT 1) AS taint"],
        "a taint as JSON": ["'source', t.source, 'reason', t.reason, 'actor', t.actor,"],
        "the node facts' columns": ["n.local_disk_free, n.local_disk_total, n.knows_its_weights,"],
        "the disk check": ['"(n.local_disk_free IS NULL OR n.local_disk_free >= :min_disk)"'],
        "the node facts re-aliased": [
            "k.state AS picked_state, k.state_reason AS picked_state_reason,"
        ],
    }
    patterns = {**TAINT_FRAGMENTS, **FACT_FRAGMENTS}
    for what, lines in old_forms.items():
        for line in lines:
            assert patterns[what].search(line), (what, line)
    # And the homes' own definitions, so that a copy of one is caught.
    taint = taints.first_taint("n.id", "g.idx", taints.withholding("t"))
    for what in TAINT_FRAGMENTS:
        assert TAINT_FRAGMENTS[what].search(taint), what
    facts = statements.node_facts_sql("n")
    assert FACT_FRAGMENTS["the node facts' columns"].search(facts)
    assert FACT_FRAGMENTS["the disk check"].search(statements.disk_fits("n"))
    for name in statements.NODE_FACTS:
        assert name in statements.pick_sql(statements.PlaceRequest("r", "c", 1), False)
