"""The agent's side of the GraphQL contract: its two mutations over httpx.

The operations are kept as .graphql documents beside this module, and a test
validates each against the service's exported schema, so the agent and the
service meet only at the schema and cannot drift apart unnoticed.
"""

from dataclasses import dataclass
from importlib.resources import files
from typing import Any

import httpx

from agent.running_shards import RunningShard, ShardToStop
from agent.validations import ValidationOutcome, ValidationRequest


def load_operation(name: str) -> str:
    """The text of agent/operations/<name>.graphql."""
    return files("agent").joinpath("operations", f"{name}.graphql").read_text()


class ServiceUnavailable(Exception):
    """The service could not be reached or did not answer: worth retrying unchanged."""


class ServiceError(Exception):
    """The service answered with an error other than the ones the agent acts on."""

    def __init__(self, code: str | None, message: str) -> None:
        super().__init__(f"{message} [{code}]" if code else message)
        self.code = code


class NodeNotFound(ServiceError):
    """The service does not know this node (a new database, or it was removed): register again."""


class ReportRejected(ServiceError):
    """The service refused the report itself: sending it again unchanged cannot help."""

    def __init__(self, message: str, field: str | None, value: object) -> None:
        super().__init__("BAD_INPUT", message)
        self.field = field
        self.value = value


@dataclass(frozen=True)
class NodeStatus:
    id: str
    state: str
    state_reason: str | None
    # Only in the answers to the fenced operations (running_shards configured).
    incarnation: int | None = None
    shards_to_stop: tuple[ShardToStop, ...] = ()
    # Weights path -> the replica ids pinning it on this node (pinned paths
    # only); None when the answer was not asked for them (no model_dirs).
    pins: dict[str, tuple[str, ...]] | None = None


@dataclass(frozen=True)
class Fencing:
    """What a fenced heartbeat or report adds: the incarnation last seen, what the engines run."""

    incarnation: int | None
    running: tuple[RunningShard, ...] | None

    def variables(self) -> dict[str, Any]:
        return {
            "incarnation": self.incarnation,
            "runningShards": None
            if self.running is None
            else [shard.as_input() for shard in self.running],
        }


class InventoryClient:
    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # What a refusal says the agent sent: with no token, the fix is to make one.
        self._sent = (
            "sent no token: set token or token_file"
            if not token
            else "sent the token from token or token_file: check it is this node's and not revoked"
        )
        self._http = httpx.AsyncClient(headers=headers, timeout=timeout, transport=transport)
        # Without pins (no model_dirs) and without fencing the plain documents:
        # the service answers them on its compiled routes.
        self._register = {
            False: load_operation("register_node"),
            True: load_operation("register_node_pins"),
        }
        self._heartbeat = {
            False: load_operation("heartbeat"),
            True: load_operation("heartbeat_pins"),
        }
        # The fenced ones always ask for the pins (an empty list without weights).
        self._register_fenced = load_operation("register_node_fenced")
        self._heartbeat_fenced = load_operation("heartbeat_fenced")
        self._validations_to_run = load_operation("validations_to_run")
        self._record_validation = load_operation("record_validation")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def register_node(
        self, node_input: dict[str, Any], fencing: Fencing | None = None, pins: bool = False
    ) -> NodeStatus:
        """Send the report; `pins`: ask which weights replicas pin (NodeStatus.pins)."""
        if fencing is None:
            data = await self._execute(self._register[pins], {"input": node_input})
        else:
            variables = {"input": node_input, **fencing.variables()}
            data = await self._execute(self._register_fenced, variables)
        return _status(data["registerNode"])

    async def heartbeat(
        self, node_id: str, fencing: Fencing | None = None, pins: bool = False
    ) -> NodeStatus:
        """I am alive; `pins` as register_node's."""
        if fencing is None:
            data = await self._execute(self._heartbeat[pins], {"nodeId": node_id})
        else:
            variables = {"nodeId": node_id, **fencing.variables()}
            data = await self._execute(self._heartbeat_fenced, variables)
        return _status(data["heartbeat"])

    async def validations_to_run(self, node_id: str) -> list[ValidationRequest]:
        """The tests the inventory asks this node to run now (agent/validations.py)."""
        data = await self._execute(self._validations_to_run, {"nodeId": node_id})
        return [
            ValidationRequest(
                str(v["test"]),
                tuple(int(i) for i in v["gpuIndices"]),
                None if v.get("remediationId") is None else str(v["remediationId"]),
            )
            for v in data.get("validationsToRun") or ()
        ]

    async def record_validation(self, node_id: str, outcome: ValidationOutcome) -> None:
        await self._execute(self._record_validation, {"input": outcome.as_input(node_id)})

    async def _execute(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self._http.post(
                self.url, json={"query": query, "variables": variables}
            )
        except httpx.HTTPError as e:
            raise ServiceUnavailable(f"cannot reach {self.url}: {e!r}") from e
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code in (401, 403):
            raise ServiceError(
                "UNAUTHENTICATED",
                f"the service refused the agent (HTTP {response.status_code}"
                f"{_first_message(body)}); the agent {self._sent}",
            )
        if not isinstance(body, dict):
            raise ServiceUnavailable(
                f"{self.url} answered HTTP {response.status_code} without a GraphQL response"
            )
        errors = body.get("errors")
        if errors:
            raise _error(errors[0])
        data = body.get("data")
        if not isinstance(data, dict):
            raise ServiceUnavailable(
                f"{self.url} answered HTTP {response.status_code} without data"
            )
        return data


def _first_message(body: object) -> str:
    """': <the service's first error message>', or nothing when it gave none."""
    errors = body.get("errors") if isinstance(body, dict) else None
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        message = errors[0].get("message")
        if isinstance(message, str) and message:
            return f": {message.splitlines()[0]}"
    return ""


def _error(error: Any) -> ServiceError:
    if not isinstance(error, dict):
        return ServiceError(None, str(error))
    message = str(error.get("message", "unknown error"))
    extensions = error.get("extensions") or {}
    code = extensions.get("code") if isinstance(extensions, dict) else None
    if code == "NODE_NOT_FOUND":
        return NodeNotFound(code, message)
    if code == "BAD_INPUT":
        return ReportRejected(message, extensions.get("field"), extensions.get("value"))
    return ServiceError(code, message)


def _status(node: Any) -> NodeStatus:
    if not isinstance(node, dict):
        raise ServiceUnavailable("the service answered without the node")
    incarnation = node.get("incarnation")
    stops = tuple(
        ShardToStop(str(s["shardId"]), int(s["fence"]), str(s["reason"]))
        for s in node.get("shardsToStop") or ()
    )
    weights = node.get("weights")
    pins = (
        None
        if not isinstance(weights, list)
        else {
            str(w["path"]): tuple(str(r) for r in w.get("pinnedBy") or ())
            for w in weights
            if isinstance(w, dict) and w.get("pinnedBy")
        }
    )
    return NodeStatus(
        str(node.get("id")),
        str(node.get("state")),
        node.get("stateReason"),
        incarnation if isinstance(incarnation, int) else None,
        stops,
        pins,
    )
