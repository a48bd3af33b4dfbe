"""The agent's docs (docs/agent/) show what the agent really does: its unit file and its dry run."""

import json
import re
from pathlib import Path

from graphql import OperationDefinitionNode, parse
from graphql.execution.values import get_variable_values
from service_schema import agent_docs, load_service_schema

from agent.client import load_operation

REPO = Path(__file__).resolve().parents[2]
DOCS = agent_docs("install.md") + agent_docs("systemd.md")


def directives(unit: str) -> list[str]:
    return [line for line in unit.splitlines() if line.strip() and not line.startswith("#")]


def test_the_docs_show_the_unit_file_that_ships() -> None:
    (shown,) = re.findall(r"```ini\n(.*?)```", DOCS, re.S)
    shipped = (REPO / "deploy" / "llmgw-agent.service").read_text()
    assert directives(shown) == directives(shipped)


def test_the_dry_run_in_the_docs_is_a_registration_the_service_accepts() -> None:
    (console,) = re.findall(r"```console\n\$ llmgw-agent [^\n]*--dry-run\n(.*?)```", DOCS, re.S)
    shown = json.loads(console[console.index("{") :])
    operation = parse(load_operation("register_node")).definitions[0]
    assert isinstance(operation, OperationDefinitionNode)
    coerced = get_variable_values(
        load_service_schema(), operation.variable_definitions, {"input": shown}
    )
    assert not isinstance(coerced, list), [e.message for e in coerced]
