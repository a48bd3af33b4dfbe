"""The event log: every state change with time, actor and reason, filtered and paged, kept for a while."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.web.logs import JsonFormatter, RequestIdFilter
from tests.support.api import Api
from tests.support.reports import REGISTER, node_input

EVENTS = """
query Events($nodeId: ID, $replicaId: ID, $kinds: [String!], $since: DateTime,
             $first: Int, $after: ID) {
  events(nodeId: $nodeId, replicaId: $replicaId, kinds: $kinds, since: $since,
         first: $first, after: $after) {
    id at kind nodeId replicaId actor reason
  }
}
"""


async def events(api: Api, **variables: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await api(EVENTS, variables))["events"]
    return found


async def a_cordon_and_back(api: Api) -> None:
    await api(REGISTER, {"input": node_input("gpu-01")})
    await api(REGISTER, {"input": node_input("gpu-02")})
    await api('mutation { cordonNode(id: "gpu-01", reason: "fan failure") { id } }')
    await api('mutation { uncordonNode(id: "gpu-01") { id } }')
    await api('mutation { drainNode(id: "gpu-02", reason: "rack move") { id } }')
    await api('mutation { removeNode(id: "gpu-02") }')


async def test_each_change_is_an_event_with_its_reason_in_order(api: Api) -> None:
    await a_cordon_and_back(api)
    log = await events(api)
    assert [(e["kind"], e["nodeId"], e["reason"]) for e in log] == [
        ("registered", "gpu-01", None),
        ("registered", "gpu-02", None),
        ("cordoned", "gpu-01", "fan failure"),
        ("uncordoned", "gpu-01", None),
        ("drained", "gpu-02", "rack move"),
        ("removed", "gpu-02", None),
    ]
    assert all(e["at"].endswith("+00:00") for e in log)
    assert [int(e["id"]) for e in log] == sorted(int(e["id"]) for e in log)


async def test_events_filter_by_node_and_kind(api: Api) -> None:
    await a_cordon_and_back(api)
    assert [e["kind"] for e in await events(api, nodeId="gpu-02")] == [
        "registered",
        "drained",
        "removed",
    ]
    assert [e["nodeId"] for e in await events(api, kinds=["cordoned", "drained"])] == [
        "gpu-01",
        "gpu-02",
    ]


async def test_pages_follow_one_another_without_gaps(api: Api) -> None:
    await a_cordon_and_back(api)
    everything = await events(api)
    first = await events(api, first=4)
    rest = await events(api, first=4, after=first[-1]["id"])
    assert first + rest == everything


async def test_since_and_retention_hide_old_events(api: Api, engine: AsyncEngine) -> None:
    await a_cordon_and_back(api)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE events SET at = now() - interval '1 hour' WHERE kind = 'registered'")
        )
        # Older than the default retention (7 days): hidden even before a sweep prunes it.
        await conn.execute(
            text("UPDATE events SET at = now() - interval '8 days' WHERE kind = 'removed'")
        )
    recent = await events(api, since="2000-01-01T00:00:00+00:00")
    assert "removed" not in [e["kind"] for e in recent]
    latest = (await events(api, kinds=["cordoned"]))[0]["at"]
    assert [e["kind"] for e in await events(api, since=latest)] == [
        "cordoned",
        "uncordoned",
        "drained",
    ]


async def test_a_bad_cursor_names_the_field_and_the_value(api: Api) -> None:
    error = await api.fails(EVENTS, {"after": "yesterday"})
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert error["extensions"]["field"] == "after"
    assert "yesterday" in error["message"]
    error = await api.fails(EVENTS, {"first": 0})
    assert error["extensions"]["field"] == "first"


async def test_every_response_carries_a_request_id_and_json_logs_name_it(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/graphql", json={"query": "{ events { id } }"})
    generated = response.headers["x-request-id"]
    assert len(generated) == 16
    echoed = await client.get("/healthz", headers={"X-Request-Id": "lb-7f3a"})
    assert echoed.headers["x-request-id"] == "lb-7f3a"
    # A header that would forge log lines is replaced, not echoed.
    forged = await client.get("/healthz", headers={"X-Request-Id": 'a" evil="1'})
    assert forged.headers["x-request-id"] != 'a" evil="1'

    record = logging.LogRecord(
        "service.fleet.node_writes", logging.WARNING, __file__, 1, "GPU %d gone", (3,), None
    )
    record.request_id = "lb-7f3a"
    record.node = "gpu-01"
    RequestIdFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "GPU 3 gone"
    assert (line["level"], line["request_id"], line["node"]) == ("warning", "lb-7f3a", "gpu-01")
