"""store_statement's contract with the builders of a claim is code (storing.Wanted), checked when built.

The statement that holds GPUs reads CTEs other modules write (allocate's,
the claim's in topology_fit); a builder that left out a column used to fail,
if at all, as a wrong row at run time. Wanted checks every part when the
statement is built, so such a builder fails at import or in the golden-file
test that builds every claim shape (tests/scheduling/test_golden_sql.py).
"""

from __future__ import annotations

import itertools
import re

import pytest

from service.scheduling.allocations import Rows, Wanted, WantedMismatch, store_statement
from service.scheduling.allocations.storing import GO, WANT_GPUS, WANT_SHARDS
from service.scheduling.topology_fit import claim_wanted


def wanted(**changes: Rows | tuple[tuple[str, str], ...]) -> Wanted:
    """A complete Wanted (every column its own name), with `changes`."""
    parts: dict[str, Rows | tuple[tuple[str, str], ...]] = {
        "shards": Rows({c: f"x.{c}" for c in WANT_SHARDS}, "FROM x"),
        "gpus": Rows({c: f"y.{c}" for c in WANT_GPUS}, "FROM y"),
        "go": Rows({"call": "0", "ok": "true"}),
        **changes,
    }
    return Wanted(**parts)  # type: ignore[arg-type]


@pytest.mark.parametrize("left_out", WANT_SHARDS)
def test_a_claim_without_a_shard_column_fails_when_built(left_out: str) -> None:
    shards = Rows({c: f"x.{c}" for c in WANT_SHARDS if c != left_out}, "FROM x")
    with pytest.raises(WantedMismatch, match=rf"want_shards has no column {left_out}\b"):
        wanted(shards=shards)


def test_a_claim_without_a_gpu_or_go_column_fails_when_built() -> None:
    with pytest.raises(WantedMismatch, match=r"want_gpus has no column idx\b"):
        wanted(gpus=Rows({"call": "1", "node_id": "n", "shard_id": "s"}))
    with pytest.raises(WantedMismatch, match=r"go has no column ok\b"):
        wanted(go=Rows({"call": "1"}))


def test_a_step_may_not_take_a_name_of_the_statement() -> None:
    with pytest.raises(WantedMismatch, match="held"):
        wanted(steps=(("held", "SELECT 1"),))


def test_every_claim_shape_is_built() -> None:
    # claim_wanted's every combination builds (the golden files show the
    # ones placement asks for); each gives what store_statement reads.
    for flags in itertools.product((False, True), repeat=5):
        claim = claim_wanted(*flags)
        assert set(WANT_SHARDS) <= set(claim.shards.columns)
        store_statement(claim)


def test_store_statement_reads_every_column_the_contract_names() -> None:
    # A column the contract names but the statement never reads would make
    # every builder carry it for nothing: the contract is what is read.
    claim = wanted()
    body = store_statement(claim).text.split(claim.ctes(), 1)[1]
    read = set(re.findall(r"\bw\.(\w+)", body))
    assert set(WANT_SHARDS) | set(WANT_GPUS) <= read
    assert set(GO) <= set(re.findall(r"\bgo\.(\w+)", body))


def test_rows_names_each_column() -> None:
    rows = Rows({"call": "0", "node_id": "r.node_id", "idx": "idx", "ok": "a AND b"}, "FROM r")
    assert rows.sql() == "SELECT 0 AS call, r.node_id, idx, a AND b AS ok FROM r"
