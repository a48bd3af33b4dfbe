"""The agent's configuration: a TOML file, each key overridable by an LLMGW_AGENT_* variable.

Every key is checked at start-up and a bad one stops the agent with a message
naming the key (or variable), its value and where it came from. An unknown key
is an error too: a misspelt key that is silently ignored leaves the agent
running on a default the operator believes they changed, which is the one
failure nobody looks for.
"""

import os
import shlex
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NoReturn
from urllib.parse import urlsplit

from agent.discovery.gpu_file import GpuFile, GpuFileError, read_gpu_file
from agent.discovery.identity import default_mgmt_addr, read_machine_id
from agent.running_shards import is_loopback_url
from agent.validations import ValidationCommand

DEFAULT_CONFIG_PATH = "/etc/llmgw/agent.toml"
DEFAULT_SERVICE_URL = "http://127.0.0.1:8080/graphql"
ENV_PREFIX = "LLMGW_AGENT_"
# Names the config file itself, so it is not a key.
CONFIG_PATH_VAR = ENV_PREFIX + "CONFIG"
_ENVIRONMENT = "environment"

# Process names of the serving engines this agent's node runs. A compute
# process on a GPU that matches none of them is someone else's, and makes the
# GPU not free.
DEFAULT_ENGINE_PROCESSES = ("vllm", "sglang", "trtllm-serve", "tensorrt_llm", "tritonserver")


class ConfigError(Exception):
    """A configuration the agent must not start with; the message names the key."""


@dataclass(frozen=True)
class FabricConfig:
    """An operator-assigned fabric name and the adapters cabled to it."""

    name: str
    hcas: tuple[str, ...]


@dataclass(frozen=True)
class AgentConfig:
    node_id: str
    hostname: str
    mgmt_addr: str
    service_url: str = DEFAULT_SERVICE_URL
    token: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    model_dirs: tuple[str, ...] = ()
    fabrics: tuple[FabricConfig, ...] = ()
    # Added to the built-in network and cluster filesystem types.
    shared_fs_types: tuple[str, ...] = ()
    engine_processes: tuple[str, ...] = DEFAULT_ENGINE_PROCESSES
    # Overrides the class the service derives from each GPU's name and memory.
    gpu_class: str | None = None
    # Where the GPUs come from: the driver, or a file for demos, labs and CI.
    gpu_source: Literal["nvml"] | GpuFile = "nvml"
    heartbeat_interval: float = 10.0
    scan_interval: float = 60.0
    full_report_interval: float = 300.0
    max_backoff: float = 60.0
    request_timeout: float = 10.0
    root: str = "/"
    # Where the serving stack writes the shards its engines run: an absolute
    # file path or a loopback http:// URL (agent/running_shards.py). None: the
    # agent says nothing about them (and is told nothing to stop).
    running_shards: str | None = None
    # Run once per shard the inventory says to stop; {shard_id} and {fence}
    # in its arguments are replaced. None: stops are logged only.
    stop_command: tuple[str, ...] | None = None
    stop_timeout: float = 30.0
    # The command of each validation test the inventory may ask for
    # (agent/validations.py); none: the node runs no tests itself.
    validations: Mapping[str, ValidationCommand] = field(default_factory=dict)


@dataclass(frozen=True)
class _Setting:
    """Where one raw value came from, for error messages."""

    name: str  # the key as the operator wrote it: `labels.zone`, `LLMGW_AGENT_ROOT`
    value: object
    origin: str  # the file, or "environment"

    def fail(self, problem: str) -> NoReturn:
        raise ConfigError(f"{self.name} = {self.value!r} ({self.origin}): {problem}")

    def at(self, suffix: str, value: object) -> "_Setting":
        return _Setting(f"{self.name}{suffix}", value, self.origin)

    @property
    def env_text(self) -> str | None:
        """The value when it is a variable's text, which has its own list syntax.

        In the file a list must be a TOML list: a string there is a mistake,
        not a list of one.
        """
        if self.origin == _ENVIRONMENT and isinstance(self.value, str):
            return self.value
        return None


def _text(s: _Setting) -> str:
    if not isinstance(s.value, str) or not s.value.strip():
        s.fail("must be a non-empty string")
    return s.value.strip()


def _url(s: _Setting) -> str:
    url = _text(s)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        s.fail("must be an http:// or https:// URL with a host")
    return url


def _seconds(s: _Setting) -> float:
    value = s.value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            s.fail("must be a number of seconds")
    # bool is an int to Python, but `true` is never a number of seconds.
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        s.fail("must be a positive number of seconds")
    return float(value)


def _list(s: _Setting) -> list[_Setting]:
    value = s.value
    if s.env_text is not None:
        value = [item.strip() for item in s.env_text.split(",") if item.strip()]
    if not isinstance(value, list):
        s.fail("must be a list")
    return [s.at(f"[{i}]", item) for i, item in enumerate(value)]


def _names(s: _Setting) -> tuple[str, ...]:
    return tuple(_text(item) for item in _list(s))


def _absolute_path(s: _Setting) -> str:
    path = _text(s)
    if not path.startswith("/"):
        s.fail("must be an absolute path")
    return os.path.normpath(path)


def _absolute_paths(s: _Setting) -> tuple[str, ...]:
    return tuple(_absolute_path(item) for item in _list(s))


def _gpu_source(s: _Setting) -> Literal["nvml"] | GpuFile:
    source = _text(s)
    if source == "nvml":
        return "nvml"
    if not source.startswith("/"):
        s.fail('must be "nvml" or the absolute path of a JSON file listing GPUs')
    # Read now, like token_file: a bad file stops the agent at start-up
    # instead of every scan reporting a node without the GPUs it fakes.
    try:
        return read_gpu_file(os.path.normpath(source))
    except GpuFileError as e:
        s.fail(str(e))


def _labels(s: _Setting) -> dict[str, str]:
    value = s.value
    if s.env_text is not None:
        pairs = {}
        for item in (p.strip() for p in s.env_text.split(",") if p.strip()):
            key, sep, label = item.partition("=")
            if not sep or not key.strip():
                s.fail(f"{item!r} is not key=value")
            pairs[key.strip()] = label.strip()
        value = pairs
    if not isinstance(value, dict):
        s.fail("must be a table of key = value strings")
    labels = {}
    for key, label in value.items():
        if not isinstance(label, str):
            s.at(f".{key}", label).fail("must be a string (quote it)")
        labels[str(key)] = label
    return labels


def _fabrics(s: _Setting) -> tuple[FabricConfig, ...]:
    value = s.value
    if s.env_text is not None:
        # name=hca,hca;name=hca
        tables: list[object] = []
        for item in (p.strip() for p in s.env_text.split(";") if p.strip()):
            fabric, sep, adapters = item.partition("=")
            if not sep:
                s.fail(f"{item!r} is not name=hca,hca")
            tables.append({"name": fabric.strip(), "hcas": adapters})
        value = tables
    if not isinstance(value, list):
        s.fail("must be a list of [[fabrics]] tables")
    fabrics: list[FabricConfig] = []
    for i, table in enumerate(value):
        entry = s.at(f"[{i}]", table)
        if not isinstance(table, dict):
            entry.fail("must be a table with name and hcas")
        for key in table:
            if key not in ("name", "hcas"):
                # rate_gbps in particular: the rate is measured from the port,
                # because a configured one stays right after a cable is swapped.
                entry.at(f".{key}", table[key]).fail("unknown key (a fabric has name and hcas)")
        if "name" not in table:
            entry.fail("name is required: the operator-assigned fabric name")
        if "hcas" not in table:
            entry.fail("hcas is required: the adapters cabled to this fabric")
        name = _text(entry.at(".name", table["name"]))
        hcas = _names(entry.at(".hcas", table["hcas"]))
        if not hcas:
            entry.at(".hcas", table["hcas"]).fail("must list at least one adapter")
        for j, hca in enumerate(hcas):
            if "/" in hca or hca in (".", ".."):
                entry.at(f".hcas[{j}]", hca).fail("must be an adapter name such as mlx5_0")
        if any(f.name == name for f in fabrics):
            entry.at(".name", name).fail("names another fabric too")
        fabrics.append(FabricConfig(name, hcas))
    return tuple(fabrics)


def _running_shards(s: _Setting) -> str:
    where = _text(s)
    if where.startswith("/"):
        return os.path.normpath(where)
    if is_loopback_url(where):
        return where
    s.fail(
        "must be an absolute file path or an http:// URL on a loopback address "
        "(the serving stack on this node writes it)"
    )


def _stop_command(s: _Setting) -> tuple[str, ...]:
    # A variable's text is split as a shell would; the file's is a TOML list.
    argv = tuple(shlex.split(s.env_text)) if s.env_text is not None else _names(s)
    if not argv:
        s.fail('must name a program, e.g. ["/usr/local/bin/stop-shard", "{shard_id}", "{fence}"]')
    if not any("{shard_id}" in arg for arg in argv):
        s.fail("must pass {shard_id} to the program: which shard to stop")
    return argv


def _validations(s: _Setting) -> dict[str, ValidationCommand]:
    """[validations.<test>] tables: command (a list; {gpus} becomes the GPU indices) and timeout.

    From the environment: `test=command args;test=command args` (each split
    as a shell would), with the default timeout.
    """
    value = s.value
    if s.env_text is not None:
        tables: dict[str, object] = {}
        for item in (p.strip() for p in s.env_text.split(";") if p.strip()):
            test, sep, command = item.partition("=")
            if not sep or not test.strip():
                s.fail(f"{item!r} is not test=command")
            tables[test.strip()] = {"command": shlex.split(command)}
        value = tables
    if not isinstance(value, dict):
        s.fail("must be a table of [validations.<test>] tables")
    commands: dict[str, ValidationCommand] = {}
    for test, table in value.items():
        entry = s.at(f".{test}", table)
        if not isinstance(table, dict):
            entry.fail("must be a table with command and timeout")
        for key in table:
            if key not in ("command", "timeout"):
                entry.at(f".{key}", table[key]).fail("unknown key (a test has command and timeout)")
        if "command" not in table:
            entry.fail(
                'command is required, e.g. ["dcgmi", "diag", "-r", "3", "-j", "-i", "{gpus}"]'
            )
        argv = _names(entry.at(".command", table["command"]))
        if not argv:
            entry.at(".command", table["command"]).fail("must name a program")
        timeout = _seconds(entry.at(".timeout", table["timeout"])) if "timeout" in table else None
        commands[str(test)] = (
            ValidationCommand(argv) if timeout is None else ValidationCommand(argv, timeout)
        )
    return commands


_PARSERS: dict[str, Callable[[_Setting], object]] = {
    "service_url": _url,
    "token": _text,
    "token_file": _text,
    "node_id": _text,
    "hostname": _text,
    "mgmt_addr": _text,
    "labels": _labels,
    "model_dirs": _absolute_paths,
    "fabrics": _fabrics,
    "shared_fs_types": _names,
    "engine_processes": _names,
    "gpu_class": _text,
    "gpu_source": _gpu_source,
    "heartbeat_interval": _seconds,
    "scan_interval": _seconds,
    "full_report_interval": _seconds,
    "max_backoff": _seconds,
    "request_timeout": _seconds,
    "root": _absolute_path,
    "running_shards": _running_shards,
    "stop_command": _stop_command,
    "stop_timeout": _seconds,
    "validations": _validations,
}

KEYS = tuple(_PARSERS)
ENV_VARS = tuple(ENV_PREFIX + key.upper() for key in KEYS)


def _read_file(path: str) -> dict[str, object]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"--config = {path!r}: cannot read it: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config = {path!r}: not valid TOML: {e}") from e


def _settings(path: str | None, env: Mapping[str, str]) -> dict[str, _Setting]:
    settings: dict[str, _Setting] = {}
    if path is not None:
        for key, value in _read_file(path).items():
            setting = _Setting(key, value, path)
            if key not in _PARSERS:
                setting.fail(f"unknown key; known keys: {', '.join(KEYS)}")
            settings[key] = setting
    for var, value in env.items():
        if not var.startswith(ENV_PREFIX) or var == CONFIG_PATH_VAR:
            continue
        setting = _Setting(var, value, _ENVIRONMENT)
        key = var[len(ENV_PREFIX) :].lower()
        if key not in _PARSERS:
            setting.fail(f"unknown variable; known: {', '.join(ENV_VARS)}")
        settings[key] = setting
    return settings


def _read_token(s: _Setting) -> str:
    path = _text(s)
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        s.fail(f"cannot read the token file: {e.strerror}")
    if not token:
        s.fail("the token file is empty")
    return token


def load_config(
    path: str | None, env: Mapping[str, str], *, read_token: bool = True
) -> AgentConfig:
    """The configuration from the file at `path` (None: no file) and `env`.

    Raises ConfigError naming the key, the value and its origin. With
    read_token=False (a dry run, which sends nothing) token_file is not read:
    the person trying the agent on a new node may not have a token yet, or
    may not be root where the token is 0600.
    """
    settings = _settings(path, env)
    values = {key: _PARSERS[key](s) for key, s in settings.items()}

    if "token" in settings and "token_file" in settings:
        settings["token"].fail("set token or token_file, not both")
    source = values.get("gpu_source")
    if isinstance(source, GpuFile) and source.fabrics is not None and "fabrics" in settings:
        # Two lists of adapters for one node: which one the operator meant is a guess.
        settings["fabrics"].fail(
            f"the GPU file {source.path} declares fabrics too: declare them in one place"
        )
    if "token_file" in settings:
        token_file = settings.pop("token_file")
        values.pop("token_file")
        if read_token:
            values["token"] = _read_token(token_file)
    root = str(values.get("root", "/"))

    if "node_id" not in values:
        machine_id = read_machine_id(root)
        if machine_id is None:
            raise ConfigError(
                f"node_id is not set and {root.rstrip('/')}/etc/machine-id is missing or empty: "
                f"set node_id in the config file or {ENV_PREFIX}NODE_ID"
            )
        values["node_id"] = machine_id
    if "stop_command" in settings and "running_shards" not in settings:
        settings["stop_command"].fail(
            "needs running_shards: the inventory names shards to stop only among those the "
            "agent says its engines run"
        )
    values.setdefault("hostname", socket.gethostname())
    if "mgmt_addr" not in values:
        values["mgmt_addr"] = default_mgmt_addr(str(values.get("service_url", DEFAULT_SERVICE_URL)))
    return AgentConfig(**values)  # type: ignore[arg-type]


def config_path(cli_path: str | None, env: Mapping[str, str]) -> str | None:
    """The file to read: --config, else LLMGW_AGENT_CONFIG, else the default if it exists.

    A file named on purpose must exist; the default may not, so an agent
    configured entirely from the environment (a container) needs no file.
    """
    named = cli_path or env.get(CONFIG_PATH_VAR)
    if named:
        return named
    return DEFAULT_CONFIG_PATH if os.path.exists(DEFAULT_CONFIG_PATH) else None
