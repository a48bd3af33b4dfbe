"""The fast path is removable: the service without service/graphql/fast/ and its one registration.

docs/contributing/layers.md promises that deleting the package and the
`if settings.fast_path:` block of create_app (service/web/app.py) leaves a
complete service with the same answers. Here that is done to a copy of the
service's tree: the package deleted, the block cut out of create_app, the
switch left on (its default), so nothing but the deletion keeps the fast path
out. The copy is imported in a process of its own and answers a story of an
agent and a scheduler; the same story, answered by this tree with the fast
path on, must read the same. (Every in-process story of the suite also runs
with the fast path off, `[strawberry]`: tests/conftest.py.)
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.web.app import create_app
from tests.support.databases import empty
from tests.support.reports import H100, gpus, node_input

ROOT = Path(__file__).resolve().parents[2]

CLASS = "H100-80GB"  # the class the service gives H100's model

# An agent registers and beats, a scheduler looks, places, looks again and releases.
STORY: list[tuple[str, dict[str, Any]]] = [
    (
        "mutation R($input: NodeInput!) { registerNode(input: $input) { id state schedulable } }",
        {"input": node_input("gpu-01", gpus=gpus(H100, 4))},
    ),
    (
        "mutation R($input: NodeInput!) { registerNode(input: $input) { id state } }",
        {"input": node_input("gpu-02", gpus=gpus(H100, 2))},
    ),
    ("mutation B($id: ID!) { heartbeat(nodeId: $id) { id state stateReason } }", {"id": "gpu-01"}),
    (
        "{ nodes { id state nvlinkGroups gpus { index gpuClass healthy } "
        "freeGpus { index } storage { mountPoint } allocations { shardId } } }",
        {},
    ),
    (
        "mutation P($input: PlaceInput!) { place(input: $input) { __typename "
        "... on Allocated { allocations { shardId nodeId gpuIndices } } "
        "... on Unplaceable { message } } }",
        {"input": {"replicaId": "r1", "gpuClass": CLASS, "gpusPerShard": 3}},
    ),
    ('{ node(id: "gpu-01") { id freeGpus { index } allocations { replicaId gpuIndices } } }', {}),
    ("{ freeGpus(gpuClass: " + json.dumps(CLASS) + ") { gpuIndices node { id } } }", {}),
    ('mutation { heartbeat(nodeId: "nobody") { id } }', {}),
    ('mutation { releaseReplica(replicaId: "r1") }', {}),
    ('{ node(id: "gpu-01") { freeGpus { index } } }', {}),
]

# Run by the copy's own Python: the app built as the service builds it, the
# story sent in-process, each answer printed as a JSON line.
PROGRAM = """
import asyncio, json, sys
import httpx
import service
from service.config import Settings
from service.database.db import create_engine, dispose
from service.web.app import create_app

assert service.__file__.startswith(sys.argv[1]), service.__file__
story = json.loads(sys.argv[3])

async def main():
    settings = Settings()
    assert settings.fast_path  # on: only the deletion keeps the fast path out
    engine = create_engine(sys.argv[2], settings)
    app = create_app(settings, engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
        for query, variables in story:
            answer = await client.post("/graphql", json={"query": query, "variables": variables})
            print(json.dumps([answer.status_code, answer.json()]))
    await dispose(engine)
    loaded = sorted(m for m in sys.modules if m.startswith("service.graphql.fast"))
    print(json.dumps(loaded))

asyncio.run(main())
"""


def without_the_fast_path(root: Path, into: Path) -> Path:
    """A copy of `root`'s service/ without service/graphql/fast/ and create_app's registration."""
    service = into / "service"
    shutil.copytree(root / "service", service, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(service / "graphql" / "fast")
    app = service / "web" / "app.py"
    source = app.read_text()
    (create_app_def,) = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "create_app"
    ]
    registrations = [
        node
        for node in ast.walk(create_app_def)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "settings.fast_path"
    ]
    assert len(registrations) == 1, "create_app registers the fast path in one statement"
    (registration,) = registrations
    assert registration.end_lineno is not None
    lines = source.splitlines(keepends=True)
    del lines[registration.lineno - 1 : registration.end_lineno]
    app.write_text("".join(lines))
    # Nothing else names the package in code: the registration was its only way in.
    for path in service.rglob("*.py"):
        tree = ast.parse(path.read_text())
        named = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom | ast.Import)
            and any(
                "graphql.fast" in name
                for name in ([getattr(node, "module", "") or ""] + [a.name for a in node.names])
            )
        ]
        assert named == [], path
    return service


async def answered_here(engine: AsyncEngine, settings: Settings) -> list[Any]:
    app = create_app(settings.replace(fast_path=True), engine=engine)
    transport = httpx.ASGITransport(app=app)
    answers = []
    async with httpx.AsyncClient(transport=transport, base_url="http://inventory") as client:
        for query, variables in STORY:
            answer = await client.post("/graphql", json={"query": query, "variables": variables})
            answers.append([answer.status_code, answer.json()])
    return answers


def _without_request_ids(answer: Any) -> Any:
    if isinstance(answer, dict):
        return {k: _without_request_ids(v) for k, v in answer.items() if k != "requestId"}
    if isinstance(answer, list):
        return [_without_request_ids(v) for v in answer]
    return answer


@pytest.mark.process
async def test_the_service_without_the_fast_path_answers_the_story_as_with_it(
    engine: AsyncEngine, settings: Settings, database_url: str, tmp_path: Path
) -> None:
    copy = without_the_fast_path(ROOT, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("INVENTORY_FAST_PATH", None)
    env.pop("INVENTORY_DIRECT_EXECUTION", None)
    done = subprocess.run(  # noqa: ASYNC221 (the test waits for it, nothing else runs)
        [sys.executable, "-c", PROGRAM, str(copy), database_url, json.dumps(STORY)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    *lines, loaded = done.stdout.splitlines()
    assert json.loads(loaded) == []
    without = [json.loads(line) for line in lines]

    await empty(engine)
    with_it = await answered_here(engine, settings)

    assert _without_request_ids(without) == _without_request_ids(with_it)
    # The story did what it says: placed on the four-GPU node, then released.
    assert without[4][1]["data"]["place"]["allocations"][0]["nodeId"] == "gpu-01"
    assert without[7][1]["errors"][0]["extensions"]["code"] == "NODE_NOT_FOUND"
    assert without[6][1]["data"]["freeGpus"] == [
        {"gpuIndices": [3], "node": {"id": "gpu-01"}},
        {"gpuIndices": [0, 1], "node": {"id": "gpu-02"}},
    ]
    assert without[9][1]["data"]["node"]["freeGpus"] == [{"index": i} for i in range(4)]
