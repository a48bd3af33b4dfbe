"""Agents re-register on every restart: the same report changes nothing, a different one is logged as a change."""

from __future__ import annotations

from tests.conftest import Api, StatementCounter
from tests.reports import H100, REGISTER, gpus, node_input

EVENTS = '{ events(nodeId: "gpu-07") { kind } }'


async def kinds(api: Api) -> list[str]:
    return [e["kind"] for e in (await api(EVENTS))["events"]]


async def test_the_same_report_again_writes_only_the_node_row(
    api: Api, count_statements: StatementCounter
) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})
    count_statements.statements.clear()

    await api(REGISTER, {"input": node_input("gpu-07")})

    writes = [s for s in count_statements.statements if not s.lstrip().startswith("SELECT")]
    assert len(writes) == 1, writes
    assert await kinds(api) == ["registered"]


async def test_a_changed_report_is_logged_as_a_change_not_a_new_node(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-07")})

    await api(REGISTER, {"input": node_input("gpu-07", gpus=gpus(H100, 4))})

    assert await kinds(api) == ["registered", "report_changed"]
