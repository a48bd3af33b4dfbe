"""Hostile input, generated: every request succeeds whole or fails with a clear error, and the
stored inventory stays consistent.

Property-based tests (hypothesis) on registerNode and allocate, and a bounded
schemathesis run over every root field, all against a live service process.
Example counts are small so the suite stays fast; raise FUZZ_EXAMPLES to dig.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.consistency import inconsistencies
from tests.support.reports import A100, H100, REGISTER, gpus, node_input

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
# CI replays the same examples every run (CI=true), so a failure there is
# reproducible and never a new random find; a developer's runs explore fresh ones.
DERANDOMIZE = os.environ.get("CI") == "true"

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=DERANDOMIZE,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure prints its input anyway
    suppress_health_check=list(HealthCheck),
)

# Errors a client can act on; anything else (or "internal error") is a bug.
READABLE_CODES = {"BAD_INPUT", "NODE_NOT_FOUND", "CONFLICT", None}


def root(service: Any) -> str:
    return str(service.url).removesuffix("/graphql")


def post(client: httpx.Client, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/graphql", json={"query": query, "variables": variables})
    assert response.status_code < 500, response.text
    body: dict[str, Any] = response.json()
    for error in body.get("errors") or []:
        assert error["message"] and error["message"] != "internal error", error
        code = (error.get("extensions") or {}).get("code")
        assert code in READABLE_CODES, error
    return body


# --- registerNode -------------------------------------------------------------------------

ids = st.one_of(
    st.sampled_from(["gpu-01", "gpu-02", "gpu-03"]),  # re-registrations of the same nodes
    st.text(max_size=300),  # NUL, white space, emoji, too long...
)
texts = st.one_of(st.text(max_size=40), st.text(min_size=1000, max_size=1100))
small_ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)
byte_counts = st.one_of(st.integers(min_value=0, max_value=10**13), st.integers())

gpu_inputs = st.fixed_dictionaries(
    {"index": st.integers(min_value=-2, max_value=1100), "name": st.one_of(
        st.sampled_from([H100["name"], A100["name"]]), texts), "healthy": st.booleans()},
    optional={
        "memoryMb": small_ints,
        "uuid": texts,
        "gpuClass": texts,
        "healthReasons": st.lists(texts, max_size=20),
    },
)  # fmt: skip
fabric_inputs = st.fixed_dictionaries(
    {"fabric": texts, "hcas": st.lists(texts, max_size=70), "rateGbps": small_ints}
)
fs_inputs = st.fixed_dictionaries(
    {"id": texts, "mountPoint": texts, "shared": st.booleans(),
     "freeBytes": byte_counts, "totalBytes": byte_counts},
    optional={"fsType": texts, "directories": st.lists(texts, max_size=5)},
)  # fmt: skip
key_values = st.lists(st.fixed_dictionaries({"key": texts, "value": texts}), max_size=5)

node_inputs = st.fixed_dictionaries(
    {"id": ids, "hostname": texts, "mgmtAddr": texts,
     "gpus": st.one_of(st.just(gpus(H100, 8)), st.lists(gpu_inputs, max_size=70))},
    optional={
        "labels": key_values,
        "engineVersions": key_values,
        "memoryTotalMb": small_ints,
        "fabrics": st.lists(fabric_inputs, max_size=18),
        "storage": st.lists(fs_inputs, max_size=4),
        "weights": st.lists(st.fixed_dictionaries({"path": texts}, optional={
            "sizeBytes": byte_counts}), max_size=4),
        "agentVersion": texts,
    },
)  # fmt: skip

# Reports an agent could send, with variety where the rules allow it.
plain = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=30)
valid_reports = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["gpu-01", "gpu-02", "gpu-03"]),
        "hostname": plain,
        "mgmtAddr": st.sampled_from(["10.0.0.7", "fd00::7"]),
        "gpus": st.tuples(st.sampled_from([H100, A100]), st.integers(0, 8), st.booleans()).map(
            lambda t: gpus(t[0], t[1], healthy=t[2])
        ),
    },
    optional={
        "fabrics": st.lists(
            st.fixed_dictionaries({"fabric": st.sampled_from(["ib-a", "ib-b", "roce"]),
                                   "hcas": st.lists(plain, max_size=3),
                                   "rateGbps": st.integers(0, 800)}),
            max_size=3, unique_by=lambda f: f["fabric"]),
        "storage": st.lists(
            st.fixed_dictionaries({"id": plain, "mountPoint": plain.map(lambda p: "/" + p),
                                   "shared": st.booleans(),
                                   "freeBytes": st.integers(0, 10**12),
                                   "totalBytes": st.just(10**12)}),
            max_size=3, unique_by=lambda f: f["id"]),
        "weights": st.lists(st.fixed_dictionaries({"path": plain.map(lambda p: "/models/" + p)}),
                            max_size=3, unique_by=lambda w: w["path"]),
        "labels": st.lists(st.fixed_dictionaries({"key": plain, "value": plain}),
                           max_size=3, unique_by=lambda kv: kv["key"]),
        "memoryTotalMb": st.integers(0, 4_000_000),
    },
)  # fmt: skip

NODE = """
query($id: ID!) {
  node(id: $id) {
    hostname mgmtAddr memoryTotalMb
    gpus { index name healthy } fabrics { fabric hcas } storage { id mountPoint }
    weights { path } labels { key value }
  }
}
"""


def stored(client: httpx.Client, node_id: str) -> Any:
    return post(client, NODE, {"id": node_id})["data"]["node"]


def as_sent(report: dict[str, Any]) -> dict[str, Any]:
    """What the node query must answer after `report` was accepted."""
    return {
        "hostname": report["hostname"],
        "mgmtAddr": report["mgmtAddr"],
        "memoryTotalMb": report.get("memoryTotalMb"),
        "gpus": sorted(
            (
                {"index": g["index"], "name": g["name"], "healthy": g["healthy"]}
                for g in report["gpus"]
            ),
            key=lambda g: g["index"],
        ),
        "fabrics": sorted(
            ({"fabric": f["fabric"], "hcas": f["hcas"]} for f in report.get("fabrics") or []),
            key=lambda f: f["fabric"],
        ),
        "storage": sorted(
            ({"id": s["id"], "mountPoint": s["mountPoint"]} for s in report.get("storage") or []),
            key=lambda s: s["id"],
        ),
        "weights": sorted(
            ({"path": w["path"]} for w in report.get("weights") or []), key=lambda w: w["path"]
        ),
        "labels": sorted(report.get("labels") or [], key=lambda kv: kv["key"]),
    }


def normalised(node: Any) -> Any:
    if node is None:
        return None
    return {
        **node,
        "gpus": sorted(node["gpus"], key=lambda g: g["index"]),
        "fabrics": sorted(node["fabrics"], key=lambda f: f["fabric"]),
        "storage": sorted(node["storage"], key=lambda s: s["id"]),
        "weights": sorted(node["weights"], key=lambda w: w["path"]),
        "labels": sorted(node["labels"], key=lambda kv: kv["key"]),
    }


async def test_any_node_report_is_stored_whole_or_refused_clearly(
    live_service: Any, engine: AsyncEngine
) -> None:
    accepted: list[str] = []

    @FUZZ
    @given(report=st.one_of(valid_reports, node_inputs))
    def check(report: dict[str, Any]) -> None:
        with httpx.Client(base_url=root(live_service), timeout=30) as client:
            node_id = report["id"]
            ask_about = isinstance(node_id, str) and "\x00" not in node_id and node_id.strip()
            before = stored(client, node_id) if ask_about else None
            body = post(client, REGISTER, {"input": report})
            after = stored(client, node_id) if ask_about else None
            if body.get("errors"):
                assert normalised(after) == normalised(before), "a refused report changed the node"
            else:
                accepted.append(node_id)
                assert normalised(after) == as_sent(report)

    await asyncio.to_thread(check)
    assert accepted, "no generated report was valid: the strategy is off"
    assert await inconsistencies(engine) == []


# --- allocate -----------------------------------------------------------------------------

ALLOCATE = """
mutation($input: AllocateInput!) {
  allocate(input: $input) {
    __typename
    ... on AllocationRejected { code message }
  }
}
"""
HOLDINGS = "{ allocations(first: 1000) { shardId replicaId nodeId gpuIndices } }"

replica_ids = st.one_of(st.sampled_from(["r-1", "r-2", "r-3"]), st.text(max_size=260))
shard_inputs = st.fixed_dictionaries(
    {
        "shardId": st.one_of(st.sampled_from(["s-1", "s-2", "s-3", "s-4"]), st.text(max_size=260)),
        "nodeId": st.one_of(st.sampled_from(["n-0", "n-1", "n-cordoned", "nope"]), st.text()),
        "gpuIndices": st.lists(st.integers(min_value=-2, max_value=10), max_size=9),
    }
)
allocations = st.fixed_dictionaries(
    {"replicaId": replica_ids, "shards": st.lists(shard_inputs, max_size=4)}
)


valid_allocations = st.fixed_dictionaries(
    {
        "replicaId": st.sampled_from(["r-1", "r-2", "r-3"]),
        "shards": st.lists(
            st.fixed_dictionaries({
                "shardId": st.sampled_from(["s-1", "s-2", "s-3", "s-4"]),
                "nodeId": st.sampled_from(["n-0", "n-1"]),
                "gpuIndices": st.lists(st.integers(0, 7), min_size=1, max_size=2, unique=True),
            }),
            min_size=1, max_size=2, unique_by=lambda shard: shard["shardId"]),
    }
)  # fmt: skip


def holdings(client: httpx.Client) -> set[tuple[str, str, str, tuple[int, ...]]]:
    found = post(client, HOLDINGS, {})["data"]["allocations"]
    return {(a["shardId"], a["replicaId"], a["nodeId"], tuple(a["gpuIndices"])) for a in found}


async def test_any_allocation_is_granted_whole_or_refused_clearly(
    live_service: Any, engine: AsyncEngine
) -> None:
    with httpx.Client(base_url=root(live_service), timeout=30) as client:
        for node_id in ("n-0", "n-1", "n-cordoned"):
            post(client, REGISTER, {"input": node_input(node_id)})
        post(client, 'mutation { cordonNode(id: "n-cordoned", reason: "fuzz") { id } }', {})
    granted: list[str] = []

    @FUZZ
    @given(
        request=st.one_of(valid_allocations, allocations),
        release=st.one_of(st.none(), st.sampled_from(["r-1", "r-2", "r-3"])),
    )
    def check(request: dict[str, Any], release: str | None) -> None:
        with httpx.Client(base_url=root(live_service), timeout=30) as client:
            if release is not None:  # keep GPUs free for later examples
                post(client, "mutation($r: ID!) { releaseReplica(replicaId: $r) }",
                     {"r": release})  # fmt: skip
            before = holdings(client)
            body = post(client, ALLOCATE, {"input": request})
            after = holdings(client)
            result = (body.get("data") or {}).get("allocate")
            if result is None or result["__typename"] == "AllocationRejected":
                assert after == before, "a refused allocation changed what is held"
                if result is not None:
                    assert result["message"] and result["code"]
            else:
                granted.append(request["replicaId"])
                wanted = {
                    (s["shardId"], request["replicaId"], s["nodeId"],
                     tuple(sorted(s["gpuIndices"])))
                    for s in request["shards"]
                }  # fmt: skip
                assert {(s, r, n, tuple(sorted(g))) for s, r, n, g in after} >= wanted
                assert after - before <= wanted

    await asyncio.to_thread(check)
    assert granted, "no generated allocation was valid: the strategy is off"
    assert await inconsistencies(engine) == []


# --- schemathesis over every root field ------------------------------------------------------


def test_schemathesis_finds_no_server_error_and_no_leak(
    live_service: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import schemathesis
    from schemathesis.graphql import nodes

    # Schemathesis keeps its caches and crash reports under ./.schemathesis/:
    # here, not in the checkout the suite runs from.
    monkeypatch.chdir(tmp_path)

    # Bytes is a JSON integer of any size (disks outgrow GraphQL's 32-bit Int).
    schemathesis.graphql.scalar("Bytes", st.integers().map(nodes.Int))
    schemathesis.graphql.scalar("JSON", st.just(nodes.String("{}")))
    schema = schemathesis.graphql.from_url(live_service.url)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    seen = 0

    for operation in operations:

        @settings(
            max_examples=max(3, EXAMPLES // 8),
            deadline=None,
            database=None,
            derandomize=DERANDOMIZE,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def call(case: Any) -> None:
            nonlocal seen
            response = case.call()
            seen += 1
            assert response.status_code < 500, (case.body, response.text)
            body = response.json()
            for error in body.get("errors") or []:
                assert error.get("message") != "internal error", (case.body, error)
                code = (error.get("extensions") or {}).get("code")
                assert code not in {"INTERNAL_ERROR", "DATABASE_UNAVAILABLE"}, (case.body, error)

        call()
    assert seen >= len(operations)


@pytest.fixture(autouse=True)
def _quiet_hypothesis_output(caplog: pytest.LogCaptureFixture) -> None:
    # The service logs every refused request; the test reads its answers instead.
    caplog.set_level("CRITICAL")
