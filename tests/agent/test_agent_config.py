"""The configuration an operator writes, as docs/agent/configuration.md shows it."""

import re
from pathlib import Path

import pytest
from service_schema import agent_docs

from agent.config import (
    DEFAULT_ENGINE_PROCESSES,
    ENV_VARS,
    KEYS,
    AgentConfig,
    ConfigError,
    FabricConfig,
    load_config,
)
from agent.discovery.gpu_file import GpuFile
from agent.discovery.gpus import Gpu
from agent.validations import ValidationCommand


def documented_config() -> str:
    (toml,) = re.findall(r"```toml\n(.*?)```", agent_docs("configuration.md"), re.S)
    return toml


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "agent.token"
    path.write_text("s3cret\n")
    return path


def test_the_documented_file_loads_with_every_key_bound(tmp_path: Path, token_file: Path) -> None:
    # Written as the docs show it; only the token's path is this test's own.
    text = documented_config().replace("/etc/llmgw/agent.token", str(token_file))
    config = load_config(write_config(tmp_path, text), env={})

    assert config == AgentConfig(
        service_url="http://inventory.internal:8080/graphql",
        token="s3cret",
        node_id="gpu-07",
        hostname="gpu-07.dc1",
        mgmt_addr="10.0.0.7",
        labels={"zone": "z1", "rack": "r12"},
        model_dirs=("/data/models", "/mnt/filer/models"),
        fabrics=(
            FabricConfig("ib-a", ("mlx5_0", "mlx5_1")),
            FabricConfig("ib-b", ("mlx5_2", "mlx5_3")),
        ),
        shared_fs_types=("weka",),
        engine_processes=("vllm", "sglang", "trtllm-serve"),
        gpu_class=None,
        gpu_source="nvml",
        heartbeat_interval=10,
        scan_interval=60,
        full_report_interval=300,
        max_backoff=60,
        request_timeout=5,
        root="/",
        running_shards="/run/llmgw/running-shards.json",
        stop_command=("/usr/local/bin/stop-shard", "{shard_id}", "{fence}"),
        stop_timeout=30,
        validations={
            "dcgm_diag": ValidationCommand(("dcgmi", "diag", "-r", "3", "-j", "-i", "{gpus}"), 1800)
        },
    )


def test_every_key_and_variable_is_documented() -> None:
    docs = agent_docs("configuration.md")
    example = documented_config()
    undocumented = [k for k in KEYS if f"| `{k}` |" not in docs]
    unexplained = [v for v in ENV_VARS if f"`{v}`" not in docs]
    # token and token_file exclude each other; gpu_class is rarely wanted: the
    # example shows token_file and leaves those two to the table.
    not_shown = [
        k
        for k in KEYS
        if k not in ("token", "gpu_class") and not re.search(rf"^(\[+)?{k}\b", example, re.M)
    ]
    assert (undocumented, unexplained, not_shown) == ([], [], [])


def test_every_key_can_be_set_from_the_environment(tmp_path: Path) -> None:
    root = tmp_path / "host"
    root.mkdir()
    gpus = tmp_path / "gpus.json"
    gpus.write_text('[{"index": 0, "name": "NVIDIA H200", "memory_mb": 143771}]')
    env = {
        "LLMGW_AGENT_SERVICE_URL": "https://inv.example:9443/graphql",
        "LLMGW_AGENT_TOKEN": "t0k",
        "LLMGW_AGENT_NODE_ID": "gpu-99",
        "LLMGW_AGENT_HOSTNAME": "gpu-99.dc2",
        "LLMGW_AGENT_MGMT_ADDR": "10.9.9.9",
        "LLMGW_AGENT_LABELS": "zone=z2, rack=r1",
        "LLMGW_AGENT_MODEL_DIRS": "/models,/mnt/filer/models/",
        "LLMGW_AGENT_FABRICS": "ib-a=mlx5_0,mlx5_1; ib-b=mlx5_2",
        "LLMGW_AGENT_SHARED_FS_TYPES": "weka,vast",
        "LLMGW_AGENT_ENGINE_PROCESSES": "ollama",
        "LLMGW_AGENT_GPU_CLASS": "H100-80GB",
        "LLMGW_AGENT_GPU_SOURCE": str(gpus),
        "LLMGW_AGENT_HEARTBEAT_INTERVAL": "2.5",
        "LLMGW_AGENT_SCAN_INTERVAL": "30",
        "LLMGW_AGENT_FULL_REPORT_INTERVAL": "600",
        "LLMGW_AGENT_MAX_BACKOFF": "120",
        "LLMGW_AGENT_REQUEST_TIMEOUT": "3",
        "LLMGW_AGENT_ROOT": str(root),
        "LLMGW_AGENT_RUNNING_SHARDS": "http://127.0.0.1:9101/running-shards",
        "LLMGW_AGENT_STOP_COMMAND": "/usr/local/bin/stop-shard {shard_id} {fence}",
        "LLMGW_AGENT_STOP_TIMEOUT": "20",
        "LLMGW_AGENT_VALIDATIONS": "dcgm_diag=dcgmi diag -r 3 -j -i {gpus}; nccl=/opt/nccl -g 1",
        "PATH": "/usr/bin",  # not the agent's: ignored
    }
    assert {v for v in env if v.startswith("LLMGW_AGENT_")} == set(ENV_VARS) - {
        "LLMGW_AGENT_TOKEN_FILE"
    }
    assert load_config(None, env) == AgentConfig(
        service_url="https://inv.example:9443/graphql",
        token="t0k",
        node_id="gpu-99",
        hostname="gpu-99.dc2",
        mgmt_addr="10.9.9.9",
        labels={"zone": "z2", "rack": "r1"},
        model_dirs=("/models", "/mnt/filer/models"),
        fabrics=(FabricConfig("ib-a", ("mlx5_0", "mlx5_1")), FabricConfig("ib-b", ("mlx5_2",))),
        shared_fs_types=("weka", "vast"),
        engine_processes=("ollama",),
        gpu_class="H100-80GB",
        gpu_source=GpuFile(str(gpus), (Gpu(index=0, name="NVIDIA H200", memory_mb=143771),)),
        heartbeat_interval=2.5,
        scan_interval=30,
        full_report_interval=600,
        max_backoff=120,
        request_timeout=3,
        root=str(root),
        running_shards="http://127.0.0.1:9101/running-shards",
        stop_command=("/usr/local/bin/stop-shard", "{shard_id}", "{fence}"),
        stop_timeout=20,
        validations={
            "dcgm_diag": ValidationCommand(("dcgmi", "diag", "-r", "3", "-j", "-i", "{gpus}")),
            "nccl": ValidationCommand(("/opt/nccl", "-g", "1")),
        },
    )


def test_a_variable_overrides_the_file(tmp_path: Path, token_file: Path) -> None:
    path = write_config(tmp_path, 'node_id = "gpu-07"\nheartbeat_interval = 10\n')
    env = {"LLMGW_AGENT_HEARTBEAT_INTERVAL": "3", "LLMGW_AGENT_TOKEN_FILE": str(token_file)}
    config = load_config(path, env)
    assert (config.node_id, config.heartbeat_interval, config.token) == ("gpu-07", 3.0, "s3cret")


def test_defaults_describe_this_machine(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/machine-id").write_text("4c4c4544004e3510804bc4c04f4e3633\n")
    config = load_config(None, {"LLMGW_AGENT_ROOT": str(tmp_path)})
    assert config.node_id == "4c4c4544004e3510804bc4c04f4e3633"
    # The service is on this machine by default, so this is the route to it.
    assert config.mgmt_addr == "127.0.0.1"
    assert config.hostname
    assert (config.heartbeat_interval, config.full_report_interval) == (10, 300)
    assert config.engine_processes == DEFAULT_ENGINE_PROCESSES
    assert (config.model_dirs, config.fabrics, config.token) == ((), (), None)


def test_no_node_id_and_no_machine_id_is_an_error_saying_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"node_id is not set .*etc/machine-id.*LLMGW_AGENT_NODE_ID"
    ):
        load_config(None, {"LLMGW_AGENT_ROOT": str(tmp_path)})


BAD_FILES = [
    ("heartbeat_intervall = 10", "heartbeat_intervall = 10 (FILE): unknown key"),
    ("heartbeat_interval = 0", "heartbeat_interval = 0 (FILE): must be a positive number"),
    ('heartbeat_interval = "10s"', "heartbeat_interval = '10s' (FILE): must be a number"),
    ("scan_interval = true", "scan_interval = True (FILE): must be a positive number"),
    ('service_url = "inventory:8080"', "service_url = 'inventory:8080' (FILE): must be an http"),
    ('model_dirs = "/data/models"', "model_dirs = '/data/models' (FILE): must be a list"),
    ('model_dirs = ["data/models"]', "model_dirs[0] = 'data/models' (FILE): must be an absolute"),
    ('hostname = ""', "hostname = '' (FILE): must be a non-empty string"),
    ("[labels]\nzone = 1", "labels.zone = 1 (FILE): must be a string"),
    (
        '[[fabrics]]\nhcas = ["mlx5_0"]',
        "fabrics[0] = {'hcas': ['mlx5_0']} (FILE): name is required",
    ),
    ('[[fabrics]]\nname = "ib-a"', "fabrics[0] = {'name': 'ib-a'} (FILE): hcas is required"),
    (
        '[[fabrics]]\nname = "ib-a"\nhcas = ["mlx5_0"]\nrate_gbps = 400',
        "fabrics[0].rate_gbps = 400 (FILE): unknown key",
    ),
    (
        '[[fabrics]]\nname = "ib-a"\nhcas = []',
        "fabrics[0].hcas = [] (FILE): must list at least one",
    ),
    (
        '[[fabrics]]\nname = "a"\nhcas = ["mlx5_0"]\n[[fabrics]]\nname = "a"\nhcas = ["mlx5_1"]',
        "fabrics[1].name = 'a' (FILE): names another fabric too",
    ),
    ('token = "x"\ntoken_file = "/nonexistent"', "token = 'x' (FILE): set token or token_file"),
    ('token_file = "/nonexistent/agent.token"', "token_file = '/nonexistent/agent.token' (FILE)"),
    ("root = 'host'", "root = 'host' (FILE): must be an absolute path"),
    (
        'gpu_source = "gpus.json"',
        """gpu_source = 'gpus.json' (FILE): must be "nvml" or the absolute path of a JSON file""",
    ),
    (
        'gpu_source = "/nonexistent/gpus.json"',
        "gpu_source = '/nonexistent/gpus.json' (FILE): cannot read the GPU file: No such file",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_a_bad_value_in_the_file_is_named_with_its_value(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write_config(tmp_path, 'node_id = "gpu-07"\n' + text + "\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path, {})
    assert message.replace("FILE", path) in str(raised.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LLMGW_AGENT_NODEID": "x"}, "LLMGW_AGENT_NODEID = 'x' (environment): unknown variable"),
        (
            {"LLMGW_AGENT_MAX_BACKOFF": "-1"},
            "LLMGW_AGENT_MAX_BACKOFF = '-1' (environment): must be",
        ),
        (
            {"LLMGW_AGENT_LABELS": "zone"},
            "LLMGW_AGENT_LABELS = 'zone' (environment): 'zone' is not",
        ),
        (
            {"LLMGW_AGENT_FABRICS": "mlx5_0"},
            "LLMGW_AGENT_FABRICS = 'mlx5_0' (environment): 'mlx5_0'",
        ),
        (
            {"LLMGW_AGENT_FABRICS": "ib-a=../../etc"},
            "LLMGW_AGENT_FABRICS[0].hcas[0] = '../../etc' (environment): must be an adapter name",
        ),
    ],
)
def test_a_bad_variable_is_named_with_its_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, {"LLMGW_AGENT_NODE_ID": "gpu-07", **env})
    assert message in str(raised.value)


def test_a_missing_or_broken_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(str(tmp_path / "nope.toml"), {})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write_config(tmp_path, "node_id = gpu-07\n"), {})
