"""The schedulers' client is generated from the exported schema, and stays so.

Like the schema reference (test_docs_site.py): the committed
clients/python/llmgw_inventory_client/generated/ must be what ariadne-codegen
(pinned in the client's codegen extra) writes from schema.graphql and
clients/python/operations/ now. And the operations keep the rules the
client's methods are named and retried by.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import llmgw_inventory_client
import pytest
from graphql import (
    FragmentDefinitionNode,
    GraphQLInputObjectType,
    OperationDefinitionNode,
    build_schema,
    get_named_type,
    parse,
    validate,
)
from llmgw_inventory_client import retries
from llmgw_inventory_client.client import InventoryClient
from llmgw_inventory_client.generated import enums, fragments

from service.graphql.fast.compiled_page import ROOTS

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "clients" / "python"
REGENERATE = CLIENT / "codegen" / "regenerate.py"
GENERATED = CLIENT / "llmgw_inventory_client" / "generated"
SCHEMA = build_schema((REPO / "schema.graphql").read_text())


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REGENERATE), "--check", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.process
def test_the_generated_client_is_current() -> None:
    done = check()
    assert done.returncode == 0, done.stderr


@pytest.mark.process
def test_check_names_what_is_stale_and_the_command(tmp_path: Path) -> None:
    stale = tmp_path / "generated"
    shutil.copytree(GENERATED, stale, ignore=shutil.ignore_patterns("__pycache__"))
    client = stale / "client.py"
    client.write_text(client.read_text().replace("async def place(", "async def placed("))
    (stale / "fit.py").unlink()
    (stale / "leftover.py").write_text("")
    done = check("--target", str(stale))
    assert done.returncode == 1
    assert f"{stale} is stale: run `python3 dev.py codegen`" in done.stderr
    assert "differs: client.py" in done.stderr and "+    async def place(" in done.stderr
    assert "missing: fit.py" in done.stderr
    assert "not generated (delete it): leftover.py" in done.stderr


def operations() -> dict[Path, list[OperationDefinitionNode]]:
    found = {}
    for path in sorted((CLIENT / "operations").glob("*.graphql")):
        document = parse(path.read_text())
        found[path] = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    return found


def all_documents() -> str:
    return "\n".join(p.read_text() for p in sorted((CLIENT / "operations").glob("*.graphql")))


def test_the_operations_are_valid_against_the_schema() -> None:
    assert validate(SCHEMA, parse(all_documents())) == []


def test_each_operation_is_named_after_its_root_field_and_file() -> None:
    # So the methods read place, release_replica, free_gpus... The one exception:
    # a "<field>Compiled" twin that takes only the arguments the service compiles.
    for path, defined in operations().items():
        if path.name == "fragments.graphql":
            assert defined == []
            continue
        (operation,) = defined
        assert operation.name is not None
        name = operation.name.value
        (root,) = operation.selection_set.selections
        field = root.name.value  # type: ignore[union-attr]
        assert name in (field, f"{field}Compiled"), path.name
        assert path.stem == re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        method = path.stem
        assert callable(getattr(InventoryClient, method, None)), method


def test_the_compiled_twins_take_exactly_the_arguments_the_service_compiles() -> None:
    # service/graphql/fast/compiled_page.py: a document naming any other
    # argument is answered by graphql-core, several times slower.
    twins = {
        op.name.value: op
        for defined in operations().values()
        for op in defined
        if op.name is not None and op.name.value.endswith("Compiled")
    }
    assert sorted(twins) == ["freeGpusCompiled", "nodesCompiled"]
    for name, operation in twins.items():
        (root,) = operation.selection_set.selections
        field = name.removesuffix("Compiled")
        arguments = {a.name.value for a in root.arguments or ()}  # type: ignore[union-attr]
        assert arguments == set(ROOTS[field]), name


def test_every_operation_is_either_retried_or_sent_once() -> None:
    names = {op.name.value for defined in operations().values() for op in defined if op.name}
    assert retries.IDEMPOTENT.isdisjoint(retries.NOT_RETRIED)
    assert names == retries.IDEMPOTENT | retries.NOT_RETRIED
    assert names >= retries.HOLD_GPUS and not retries.HOLD_GPUS & {"releaseReplica"}


def test_the_package_exports_every_shape_enum_and_input_a_scheduler_handles() -> None:
    document = parse(all_documents())
    shapes = {d.name.value for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    enum_names = {
        name for name, value in vars(enums).items() if isinstance(value, type) and value.__module__ == enums.__name__
    }  # fmt: skip
    inputs: set[str] = set()

    def reach(type_name: str) -> None:
        named = SCHEMA.get_type(type_name)
        if isinstance(named, GraphQLInputObjectType) and named.name not in inputs:
            inputs.add(named.name)
            for field in named.fields.values():
                reach(get_named_type(field.type).name)

    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            for variable in definition.variable_definitions or ():
                type_node = variable.type
                while not hasattr(type_node, "name"):
                    type_node = type_node.type  # type: ignore[attr-defined]
                reach(type_node.name.value)  # type: ignore[attr-defined]
    exported = set(llmgw_inventory_client.__all__)
    assert shapes - exported == set() and all(hasattr(fragments, s) for s in shapes)
    assert enum_names - exported == set()
    assert inputs - exported == set()
