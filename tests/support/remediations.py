"""Remediation stories' pieces: the mutations, a node with its validations, what is stored."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.api import Api

REMEDIATIONS = """
query R($state: RemediationState, $node: ID) {
  remediations(state: $state, nodeId: $node) {
    id nodeId gpuIndices action state cause attempts trigger taintKey scope
  }
}
"""


NODE = """
query N($id: ID!) {
  node(id: $id) {
    bootId validationsToRun { test gpuIndices remediationId }
    gpus { index healthy healthReasons recommendedAction taints { key effect source reason } }
    freeGpus { index }
  }
}
"""


START = "mutation S($id: ID!) { startRemediation(id: $id) { id state action } }"


FINISH = """
mutation F($id: ID!, $ok: Boolean!, $note: String) {
  finishRemediation(id: $id, succeeded: $ok, note: $note) { id state action }
}
"""


VALIDATE = """
mutation V($input: ValidationInput!) { recordValidation(input: $input) { id state attempts } }
"""


def validation(indices: list[int], passed: bool, test: str = "dcgm_diag") -> dict[str, Any]:
    return {
        "input": {
            "nodeId": "gpu-01",
            "gpuIndices": indices,
            "test": test,
            "passed": passed,
            "details": '{"result": "pass"}' if passed else '{"result": "fail"}',
        }
    }


async def remediations(api: Api, **variables: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await api(REMEDIATIONS, variables))["remediations"]
    return found


async def stored(engine: AsyncEngine) -> tuple[Any, ...]:
    async with engine.connect() as conn:
        found = []
        for table in ("remediations", "validation_results", "taints", "gpus", "gpu_pools"):
            found.append((await conn.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2"))).all())
    return tuple(found)


EVENTS = """
query E($kinds: [String!]) { events(kinds: $kinds) { kind actor reason detail } }
"""
