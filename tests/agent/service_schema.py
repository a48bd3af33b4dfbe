"""The schema the agent is checked against: the service's export when it exists.

The service's exported schema is preferred (it is the real one); the fixed
minimum contract, which it must be a superset of, is the fallback.
"""

from pathlib import Path

import pytest
from graphql import GraphQLSchema, build_schema

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = [
    REPO / "schema.graphql",
    REPO / "tests" / "contract.graphql",
    REPO.parent / "shared" / "contract.graphql",
]


def load_service_schema() -> GraphQLSchema:
    for path in SCHEMAS:
        if path.exists():
            return build_schema(path.read_text())
    pytest.fail(f"no schema to check the agent against: looked for {[str(p) for p in SCHEMAS]}")


def agent_docs(page: str) -> str:
    """A page of the agent's documentation (docs/agent/): the blocks a node's operator copies."""
    return (REPO / "docs" / "agent" / page).read_text()
