"""GPUs from a file (`gpu_source`): the compose demo, a lab or CI reporting GPUs it does not have."""

import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fake_inventory_service import FakeService
from fake_nvml import FakeNvml, h200
from fake_root import FakeDisks, make_node
from service_schema import agent_docs

from agent.cli import main
from agent.client import InventoryClient
from agent.config import ConfigError, load_config
from agent.discovery.gpu_file import GpuFile
from agent.discovery.weights import WeightsScanner
from agent.loop import Agent
from agent.report import Host, build_report

REPO = Path(__file__).resolve().parents[2]
WARNING = "GPUs come from {path} (gpu_source), not from the NVIDIA driver"

TWO_GPUS = [
    {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_mb": 81559,
        "uuid": "GPU-lab-0",
        "pci_bus_id": "00000000:18:00.0",
        "healthy": True,
        "health_reasons": [],
    },
    # A figure the driver could not read is left out, as NVML's would be.
    {"index": 1, "name": "NVIDIA H100 80GB HBM3", "health_reasons": ["row_remap_failed"]},
]


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return make_node(tmp_path / "node")


def gpu_file(tmp_path: Path, content: object) -> Path:
    path = tmp_path / "gpus.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def host_with_a_driver(node: Path) -> tuple[Host, FakeNvml]:
    # A driver that would answer, so a report without its H200 proves it was not asked.
    nvml = FakeNvml([h200()])
    disks = FakeDisks(node)
    return Host(nvml=nvml, statvfs=disks.statvfs, stat=disks.stat), nvml


def test_the_dry_run_shows_the_files_gpus_and_warns_they_are_not_the_drivers(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = gpu_file(tmp_path, TWO_GPUS)
    env = {"LLMGW_AGENT_NODE_ID": "lab-1", "LLMGW_AGENT_ROOT": str(node)}
    host, nvml = host_with_a_driver(node)

    assert main(["--dry-run"], env={**env, "LLMGW_AGENT_GPU_SOURCE": str(path)}, host=host) == 0
    out, err = capsys.readouterr()

    assert json.loads(out)["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-lab-0",
            "pciBusId": "00000000:18:00.0",
            "memoryMb": 81559,
            "healthy": True,
            "healthReasons": [],
        },
        {
            "index": 1,
            "name": "NVIDIA H100 80GB HBM3",
            "healthy": False,
            "healthReasons": ["row_remap_failed"],
        },
    ]
    assert not nvml.initialized
    assert [line for line in err.splitlines() if "gpu_source" in line] == [
        "warning: "
        + WARNING.format(path=path)
        + ": their health is what the file says, not what the hardware says"
    ]


async def test_a_running_agent_warns_once_not_every_scan(
    tmp_path: Path, node: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.agent")
    path = gpu_file(tmp_path, TWO_GPUS)
    config = load_config(
        None,
        {
            "LLMGW_AGENT_NODE_ID": "lab-1",
            "LLMGW_AGENT_ROOT": str(node),
            "LLMGW_AGENT_GPU_SOURCE": str(path),
        },
    )
    host, _ = host_with_a_driver(node)
    weights = WeightsScanner(config.root)
    client = InventoryClient(config.service_url, None, 1.0, transport=FakeService().transport())
    agent = Agent(config, client, lambda: build_report(config, host, weights))
    try:
        for _ in range(3):
            report = await agent.survey()
            assert report is not None and len(report.node_input["gpus"]) == 2
    finally:
        await client.aclose()

    warned = [r.getMessage() for r in caplog.records if "gpu_source" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(WARNING.format(path=path))


def compose_agent() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    agent: dict[str, Any] = services["agent"]
    return agent


def test_the_compose_demo_agent_reports_eight_h100s_one_with_ecc_errors_on_ib_a(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = compose_agent()
    env: dict[str, str] = dict(agent["environment"])
    in_container = env["LLMGW_AGENT_GPU_SOURCE"]
    # The file the compose agent reads is the one this repository ships.
    mounts = {target: source for source, target, *_ in (v.split(":") for v in agent["volumes"])}
    shipped = REPO / mounts[in_container]
    assert shipped == REPO / "deploy" / "demo-gpus.json"

    env.update(LLMGW_AGENT_GPU_SOURCE=str(shipped), LLMGW_AGENT_ROOT=str(node))
    # The demo container has no NVIDIA driver, nor nvidia-ml-py perhaps.
    host = Host(nvml=None, statvfs=FakeDisks(node).statvfs, stat=FakeDisks(node).stat)
    refuse = httpx.MockTransport(lambda request: pytest.fail("a dry run sent a request"))
    assert main(["--dry-run"], env=env, host=host, transport=refuse) == 0
    out, err = capsys.readouterr()

    report = json.loads(out)
    gpus = report["gpus"]
    # A rail adapter per GPU on fabric ib-a: the demo's fabric questions have answers.
    assert report["fabrics"] == [
        {"fabric": "ib-a", "hcas": [f"mlx5_{i}" for i in range(8)], "rateGbps": 400}
    ]
    assert [g["nearHcas"] for g in gpus] == [[f"mlx5_{i}"] for i in range(8)]
    assert [(g["index"], g["name"], g["memoryMb"]) for g in gpus] == [
        (i, "NVIDIA H100 80GB HBM3", 81559) for i in range(8)
    ]
    assert [(g["index"], g["healthReasons"]) for g in gpus if not g["healthy"]] == [
        (5, ["ecc_uncorrected"])
    ]
    assert len({g["uuid"] for g in gpus}) == len({g["pciBusId"] for g in gpus}) == 8
    assert WARNING.format(path=shipped) in err
    assert "nvidia-ml-py is not installed" not in err


def test_the_documented_example_file_loads(tmp_path: Path) -> None:
    example, with_fabrics = re.findall(r"```json\n(.*?)```", agent_docs("gpu-file.md"), re.S)
    config = load_config(
        None,
        {
            "LLMGW_AGENT_NODE_ID": "lab-1",
            "LLMGW_AGENT_GPU_SOURCE": str(gpu_file(tmp_path, example)),
        },
    )
    assert isinstance(config.gpu_source, GpuFile)
    assert [(g.index, g.healthy) for g in config.gpu_source.gpus] == [(0, True), (1, False)]
    assert config.gpu_source.fabrics is None

    (tmp_path / "lab").mkdir()
    config = load_config(
        None,
        {
            "LLMGW_AGENT_NODE_ID": "lab-1",
            "LLMGW_AGENT_GPU_SOURCE": str(gpu_file(tmp_path / "lab", with_fabrics)),
        },
    )
    assert isinstance(config.gpu_source, GpuFile) and config.gpu_source.fabrics is not None
    assert [(f.fabric, f.hcas, f.rate_gbps) for f in config.gpu_source.fabrics] == [
        ("ib-a", ("mlx5_0", "mlx5_1"), 400)
    ]


def entry(**fields: object) -> dict[str, object]:
    return {"index": 0, "name": "NVIDIA H100 80GB HBM3", **fields}


FABRIC_A = {"name": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rate_gbps": 400}

BAD_FILES: list[tuple[object, str]] = [
    ("", "not valid JSON: Expecting value: line 1 column 1"),
    ({"gpu": [entry()]}, "gpu = [{'index': 0, 'name': 'NVIDIA H100 80GB HBM3'}]: unknown field"),
    ({"fabrics": []}, "an object file needs gpus"),
    ({"gpus": {"index": 0}}, "must be a JSON list of GPU objects, or an object with gpus"),
    ({"gpus": [entry(index=-1)]}, "gpus[0].index = -1: must be a whole number"),
    ({"gpus": [entry()], "fabrics": {"ib-a": []}}, "fabrics = {'ib-a': []}: must be a list"),
    (
        {"gpus": [entry()], "fabrics": ["ib-a"]},
        "fabrics[0] = 'ib-a': must be an object with name, hcas and rate_gbps",
    ),
    (
        {"gpus": [entry()], "fabrics": [{"name": "ib-a", "hcas": ["mlx5_0"]}]},
        "rate_gbps is required",
    ),
    (
        {"gpus": [entry()], "fabrics": [{"name": "ib-a", "hcas": [], "rate_gbps": 400}]},
        "fabrics[0].hcas = []: must list at least one adapter",
    ),
    (
        {"gpus": [entry()], "fabrics": [{"name": "ib-a", "hcas": ["mlx5_0"], "rate_gbps": "NDR"}]},
        "fabrics[0].rate_gbps = 'NDR': must be a whole number of at least 1",
    ),
    (
        {"gpus": [entry()], "fabrics": [{"name": "ib-a", "hcas": ["m"], "rate_gbps": 1, "gid": 0}]},
        "fabrics[0].gid = 0: unknown field; known: name, hcas, rate_gbps",
    ),
    (
        {"gpus": [entry()], "fabrics": [FABRIC_A, {**FABRIC_A, "hcas": ["mlx5_9"]}]},
        "fabrics[1].name = 'ib-a': names another fabric too",
    ),
    (
        {"gpus": [entry()], "fabrics": [FABRIC_A, {**FABRIC_A, "name": "ib-b"}]},
        "fabrics[1].hcas[0] = 'mlx5_0': is cabled to another fabric too",
    ),
    (
        {"gpus": [entry(near_hcas=["mlx5_7"])], "fabrics": [FABRIC_A]},
        "gpus[0].near_hcas[0] = 'mlx5_7': is no adapter of the file's fabrics",
    ),
    (["NVIDIA H100"], "[0] = 'NVIDIA H100': must be an object with index and name"),
    ([{"name": "NVIDIA H100"}], "[0] = {'name': 'NVIDIA H100'}: index is required"),
    ([{"index": 0}], "[0] = {'index': 0}: name is required"),
    ([entry(index=-1)], "[0].index = -1: must be a whole number of at least 0"),
    ([entry(index=True)], "[0].index = True: must be a whole number of at least 0"),
    ([entry(name=" H100")], "[0].name = ' H100': must be a non-empty string"),
    ([entry(), entry(index=1, memory_mb="80GB")], "[1].memory_mb = '80GB': must be a whole"),
    ([entry(memory_mb=0)], "[0].memory_mb = 0: must be a whole number of at least 1"),
    ([entry(memory_gb=80)], "[0].memory_gb = 80: unknown field; known: index, name, memory_mb"),
    ([entry(uuid=7)], "[0].uuid = 7: must be a non-empty string"),
    (
        [entry(health_reasons=["ecc_uncorected"])],
        "[0].health_reasons[0] = 'ecc_uncorected': unknown reason; known: ecc_uncorrected,",
    ),
    ([entry(health_reasons="ecc_uncorrected")], "[0].health_reasons = 'ecc_uncorrected': must"),
    ([entry(healthy="no")], "[0].healthy = 'no': must be true or false"),
    ([entry(healthy=False)], "[0].healthy = False: an unhealthy GPU needs a reason"),
    (
        [entry(healthy=True, health_reasons=["nvml_error"])],
        "[0].healthy = True: a GPU with health_reasons is not healthy",
    ),
    ([entry(), entry()], "[1].index = 0: names another GPU too"),
    ([entry(uuid="GPU-a"), entry(index=1, uuid="GPU-a")], "[1].uuid = 'GPU-a': names another"),
    ('[{"index": 0, "index": 1, "name": "H100"}]', "'index' appears twice in one entry"),
    ([entry(nvlink_peers=[0])], "[0].nvlink_peers = 0: must name another GPU of this file"),
    ([entry(nvlink_peers=[3])], "[0].nvlink_peers = 3: must name another GPU of this file"),
    (
        [entry(nvlink_peers=[1]), entry(index=1, nvlink_peers=[])],
        "[0].nvlink_peers = 1: GPU 1 does not list GPU 0 back",
    ),
    ([entry(nvlink_peers="0,1")], "[0].nvlink_peers = '0,1': must be a list of GPU indices"),
    ([entry(numa_node=-1)], "[0].numa_node = -1: must be a whole number of at least 0"),
    ([entry(near_hcas=["mlx5_0", ""])], "[0].near_hcas[1] = '': must be a non-empty string"),
    ([entry(nvlink_domain="")], "[0].nvlink_domain = '': must be a non-empty string"),
]


def test_a_gpu_file_fakes_a_topology(tmp_path: Path, node: Path) -> None:
    pair = [
        entry(nvlink_peers=[1], numa_node=0, near_hcas=["mlx5_0"], nvlink_domain="c/1"),
        entry(index=1, nvlink_peers=[0], numa_node=1, near_hcas=[]),
    ]
    config = load_config(
        None,
        {
            "LLMGW_AGENT_NODE_ID": "lab-1",
            "LLMGW_AGENT_ROOT": str(node),
            "LLMGW_AGENT_GPU_SOURCE": str(gpu_file(tmp_path, pair)),
        },
    )
    host, _ = host_with_a_driver(node)
    sent = build_report(config, host, WeightsScanner(str(node))).node_input["gpus"]
    topology = [
        {k: g.get(k) for k in ("nvlinkPeers", "numaNode", "nearHcas", "nvlinkDomain")} for g in sent
    ]
    assert topology == [
        {"nvlinkPeers": [1], "numaNode": 0, "nearHcas": ["mlx5_0"], "nvlinkDomain": "c/1"},
        {"nvlinkPeers": [0], "numaNode": 1, "nearHcas": [], "nvlinkDomain": None},
    ]


def test_a_gpu_file_declares_the_fabrics_a_demo_node_is_cabled_to(
    tmp_path: Path, node: Path
) -> None:
    # No /sys/class/infiniband under the fake root: the rails come from the file alone.
    document = {
        "gpus": [entry(near_hcas=["mlx5_0"]), entry(index=1, near_hcas=["mlx5_2"])],
        "fabrics": [
            {"name": "ib-b", "hcas": ["mlx5_2"], "rate_gbps": 200},
            FABRIC_A,
        ],
    }
    env = {
        "LLMGW_AGENT_NODE_ID": "lab-1",
        "LLMGW_AGENT_ROOT": str(node),
        "LLMGW_AGENT_GPU_SOURCE": str(gpu_file(tmp_path, document)),
    }
    config = load_config(None, env)
    host, _ = host_with_a_driver(node)
    report = build_report(config, host, WeightsScanner(str(node)))
    assert report.node_input["fabrics"] == [
        {"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"], "rateGbps": 400},
        {"fabric": "ib-b", "hcas": ["mlx5_2"], "rateGbps": 200},
    ]
    assert [g["nearHcas"] for g in report.node_input["gpus"]] == [["mlx5_0"], ["mlx5_2"]]
    assert not [w for w in report.warnings if "infiniband" in w]


def test_fabrics_in_the_gpu_file_and_in_the_config_stop_the_agent(tmp_path: Path) -> None:
    path = gpu_file(tmp_path, {"gpus": [entry()], "fabrics": [FABRIC_A]})
    env = {
        "LLMGW_AGENT_NODE_ID": "lab-1",
        "LLMGW_AGENT_GPU_SOURCE": str(path),
        "LLMGW_AGENT_FABRICS": "ib-a=mlx5_0",
    }
    with pytest.raises(ConfigError, match=f"the GPU file {path} declares fabrics too"):
        load_config(None, env)


@pytest.mark.parametrize(("content", "problem"), BAD_FILES)
def test_a_bad_gpu_file_stops_the_agent_naming_the_key_entry_and_value(
    tmp_path: Path, content: object, problem: str
) -> None:
    path = gpu_file(tmp_path, content)
    config = tmp_path / "agent.toml"
    config.write_text(f'node_id = "lab-1"\ngpu_source = "{path}"\n')
    with pytest.raises(ConfigError) as raised:
        load_config(str(config), {})
    assert str(raised.value).startswith(f"gpu_source = {str(path)!r} ({config}): ")
    assert problem in str(raised.value)


def test_a_bad_gpu_file_is_a_configuration_error_at_start_up(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = gpu_file(tmp_path, [entry(memory_mb="80GB")])
    env = {"LLMGW_AGENT_NODE_ID": "lab-1", "LLMGW_AGENT_GPU_SOURCE": str(path)}
    host, _ = host_with_a_driver(node)
    # Exit status 2: the systemd unit does not restart a bad configuration.
    assert main(["--dry-run"], env=env, host=host) == 2
    assert capsys.readouterr().err == (
        f"llmgw-agent: configuration error: LLMGW_AGENT_GPU_SOURCE = {str(path)!r} "
        "(environment): [0].memory_mb = '80GB': must be a whole number of at least 1\n"
    )
