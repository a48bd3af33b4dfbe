"""The inventory service as the agent sees it over HTTP, for httpx.MockTransport.

It answers the two mutations (with the pins on the node's weights when asked) the way the
contract says the real service does,
and can be taken down, made to forget its nodes (a restart on an empty
database), to refuse reports, or to hang.
"""

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx


class FakeService:
    def __init__(self, clock: Callable[[], float] = lambda: 0.0) -> None:
        self.clock = clock
        self.nodes: dict[str, dict[str, Any]] = {}
        # (time, "register" | "heartbeat"), as the service received them.
        self.calls: list[tuple[float, str]] = []
        self.requests: list[httpx.Request] = []
        self.down = False
        self.status: int | None = None  # answer every request with this bare HTTP status
        self.rejecting: tuple[str, object] | None = None  # (field, value) of BAD_INPUT
        self.hang = False
        self.hanging = asyncio.Event()  # set once a request is hanging
        # Fencing, as the real service answers it (docs/operations/fencing.md):
        # the shards held per node as (shard id, fence), each node's
        # incarnation, and what each fenced request sent.
        self.held: dict[str, set[tuple[str, int]]] = {}
        self.incarnations: dict[str, int] = {}
        self.fenced: list[dict[str, Any]] = []
        # Weights path -> replica ids pinning it, as Node.weights.pinnedBy answers.
        self.pins: dict[str, list[str]] = {}

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def restart_empty(self) -> None:
        self.nodes.clear()

    def kinds(self, since: float = float("-inf"), until: float = float("inf")) -> list[str]:
        return [kind for at, kind in self.calls if since <= at < until]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if self.hang:
            self.hanging.set()
            await asyncio.Event().wait()
        if self.status is not None:
            return httpx.Response(self.status, text="upstream unavailable")
        body = json.loads(request.content)
        query, variables = body["query"], body["variables"]
        if "registerNode(" in query:
            self.calls.append((self.clock(), "register"))
            if self.rejecting is not None:
                field, value = self.rejecting
                return _error("BAD_INPUT", f"{field}: must be at least 0", field=field, value=value)
            node = variables["input"]
            self.nodes[node["id"]] = node
            return self._answer("registerNode", node["id"], variables, query)
        if "heartbeat(" in query:
            self.calls.append((self.clock(), "heartbeat"))
            node_id = variables["nodeId"]
            if node_id not in self.nodes:
                return _error("NODE_NOT_FOUND", f"no node {node_id!r}")
            return self._answer("heartbeat", node_id, variables, query)
        return _error("GRAPHQL_VALIDATION_FAILED", "unknown operation")

    def _answer(
        self, field: str, node_id: str, variables: dict[str, Any], query: str
    ) -> httpx.Response:
        if "runningShards" not in variables:
            answer = {"id": node_id, "state": "READY", "stateReason": None}
            return httpx.Response(
                200, json={"data": {field: self._weights(answer, node_id, query)}}
            )
        self.fenced.append(variables)
        incarnation = self.incarnations.setdefault(node_id, 1)
        claimed = variables.get("incarnation")
        if claimed is not None and claimed > incarnation:
            return _error("BAD_INPUT", "future incarnation", field="incarnation", value=claimed)
        held = self.held.get(node_id, set())
        stops = [
            {"shardId": r["shardId"], "fence": r["fence"], "reason": "RELEASED"}
            for r in variables["runningShards"] or ()
            if (r["shardId"], r["fence"]) not in held
        ]
        node = {
            "id": node_id,
            "state": "READY",
            "stateReason": None,
            "incarnation": incarnation,
            "shardsToStop": stops,
        }
        return httpx.Response(200, json={"data": {field: self._weights(node, node_id, query)}})

    def _weights(self, answer: dict[str, Any], node_id: str, query: str) -> dict[str, Any]:
        """The answer with Node.weights { path pinnedBy } when the query asks for them."""
        if "pinnedBy" not in query:
            return answer
        reported = self.nodes[node_id].get("weights") or ()
        weights = [{"path": w["path"], "pinnedBy": self.pins.get(w["path"], [])} for w in reported]
        return {**answer, "weights": weights}


def _error(code: str, message: str, **extensions: Any) -> httpx.Response:
    error = {"message": message, "path": ["x"], "extensions": {"code": code, **extensions}}
    return httpx.Response(200, json={"data": None, "errors": [error]})
