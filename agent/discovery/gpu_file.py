"""GPUs listed in a JSON file instead of read from NVML: for demos, labs and CI.

A machine without NVIDIA GPUs (a laptop, a CI runner, the compose demo) can
then report a realistic node and exercise scheduling. The file is read and
checked once, at start-up, like the rest of the configuration: a mistake in
it stops the agent with the entry, the field and the value, rather than
reporting a node with fewer GPUs than the operator meant to fake. The agent
warns that its GPUs come from a file every time it starts, so a node
configured this way by mistake is visible in its log and its dry run.
"""

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

from agent.discovery.fabrics import FabricAttachment
from agent.discovery.gpus import HEALTH_REASONS, Gpu

# Every field a GPU entry may have; anything else is a mistake, not an extra.
FIELDS = (
    "index",
    "name",
    "memory_mb",
    "uuid",
    "pci_bus_id",
    "healthy",
    "health_reasons",
    "xids",
    # Topology, so a demo or a lab can fake an HGX board or NVL pairs.
    "nvlink_peers",
    "numa_node",
    "near_hcas",
    "nvlink_domain",
)
REQUIRED = ("index", "name")
# A file that is an object holds the GPUs and, optionally, the fabrics the
# node is cabled to, so a demo or a lab reports rails without InfiniBand.
FILE_FIELDS = ("gpus", "fabrics")
FABRIC_FIELDS = ("name", "hcas", "rate_gbps")


T = TypeVar("T")


class GpuFileError(Exception):
    """The file cannot stand in for the driver; the message says where and why."""


@dataclass(frozen=True)
class GpuFile:
    """The GPUs a file lists, and the file, for the warning that names it."""

    path: str
    gpus: tuple[Gpu, ...]
    # XIDs the file says the driver raised, by GPU index: the agent reports
    # them once, in its first report after start-up (agent/discovery/xids.py), as if
    # it had heard them, to rehearse the service's handling in a lab.
    xids: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    # The fabrics the file declares, reported as they are instead of read from
    # /sys/class/infiniband; None when the file declares none (a list of GPUs).
    fabrics: tuple[FabricAttachment, ...] | None = None

    def warning(self) -> str:
        return (
            f"GPUs come from {self.path} (gpu_source), not from the NVIDIA driver: "
            "their health is what the file says, not what the hardware says"
        )


def _fail(where: str, value: object, problem: str) -> NoReturn:
    raise GpuFileError(f"{where} = {value!r}: {problem}")


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    # json keeps the last of two equal keys; which one the author meant is a guess.
    entry: dict[str, object] = {}
    for key, value in pairs:
        if key in entry:
            raise GpuFileError(f"{key!r} appears twice in one entry")
        entry[key] = value
    return entry


def _whole(where: str, value: object, low: int) -> int:
    # bool is an int to Python, and JSON's 1.0 is a float: neither is an index.
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        _fail(where, value, f"must be a whole number of at least {low}")
    return value


def _text(where: str, value: object) -> str:
    # The service refuses empty or space-padded names; say so here, at start-up.
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        _fail(where, value, "must be a non-empty string without surrounding spaces")
    return value


def _reasons(where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        _fail(where, value, "must be a list of health reasons")
    for i, reason in enumerate(value):
        if reason not in HEALTH_REASONS:
            _fail(f"{where}[{i}]", reason, f"unknown reason; known: {', '.join(HEALTH_REASONS)}")
    return tuple(value)


def _peers(where: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        _fail(where, value, "must be a list of GPU indices ([] for no NVLink)")
    return tuple(_whole(f"{where}[{i}]", peer, 0) for i, peer in enumerate(value))


def _names(where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        _fail(where, value, "must be a list of adapter names")
    return tuple(_text(f"{where}[{i}]", name) for i, name in enumerate(value))


def _xids(where: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        _fail(where, value, "must be a list of XIDs")
    return tuple(_whole(f"{where}[{i}]", xid, 1) for i, xid in enumerate(value))


def _entry(
    where: str, entry: object, known: Sequence[str], required: Sequence[str]
) -> dict[str, object]:
    """An entry as an object of known fields holding every required one, or a FileError naming it."""
    if not isinstance(entry, dict):
        listed = ", ".join(required[:-1]) + f" and {required[-1]}"
        _fail(where, entry, f"must be an object with {listed}")
    for key in entry:
        if key not in known:
            _fail(f"{where}.{key}", entry[key], f"unknown field; known: {', '.join(known)}")
    for key in required:
        if key not in entry:
            _fail(where, entry, f"{key} is required")
    return entry


def _gpu(where: str, given: object) -> Gpu:
    entry = _entry(where, given, FIELDS, REQUIRED)
    index = _whole(f"{where}.index", entry["index"], 0)
    name = _text(f"{where}.name", entry["name"])
    memory = entry.get("memory_mb")
    uuid = entry.get("uuid")
    bus_id = entry.get("pci_bus_id")
    reasons = _reasons(f"{where}.health_reasons", entry.get("health_reasons", []))
    healthy = entry.get("healthy", not reasons)
    if not isinstance(healthy, bool):
        _fail(f"{where}.healthy", healthy, "must be true or false")
    # A GPU is unhealthy exactly when it has a reason, as from the driver:
    # the scheduler and the operator both read the reason.
    if healthy and reasons:
        _fail(f"{where}.healthy", healthy, "a GPU with health_reasons is not healthy")
    if not healthy and not reasons:
        _fail(f"{where}.healthy", healthy, "an unhealthy GPU needs a reason in health_reasons")
    return Gpu(
        index=index,
        name=name,
        uuid=None if uuid is None else _text(f"{where}.uuid", uuid),
        memory_mb=None if memory is None else _whole(f"{where}.memory_mb", memory, 1),
        pci_bus_id=None if bus_id is None else _text(f"{where}.pci_bus_id", bus_id),
        health_reasons=reasons,
        nvlink_peers=_optional(entry, "nvlink_peers", where, _peers),
        numa_node=_optional(entry, "numa_node", where, lambda w, v: _whole(w, v, 0)),
        near_hcas=_optional(entry, "near_hcas", where, _names),
        nvlink_domain=_optional(entry, "nvlink_domain", where, _text),
    )


def _optional(
    entry: dict[str, object], key: str, where: str, parse: Callable[[str, object], T]
) -> T | None:
    value = entry.get(key)
    return None if value is None else parse(f"{where}.{key}", value)


def _check_peers(gpus: tuple[Gpu, ...], prefix: str) -> None:
    """Peers as the service will check them: GPUs of the file, not itself, listed by both ends."""
    peers_of = {gpu.index: gpu.nvlink_peers for gpu in gpus}
    for i, gpu in enumerate(gpus):
        for peer in gpu.nvlink_peers or ():
            where = f"{prefix}[{i}].nvlink_peers"
            if peer == gpu.index or peer not in peers_of:
                _fail(where, peer, "must name another GPU of this file")
            theirs = peers_of[peer]
            if theirs is not None and gpu.index not in theirs:
                _fail(where, peer, f"GPU {peer} does not list GPU {gpu.index} back")


def _fabric(where: str, given: object) -> FabricAttachment:
    entry = _entry(where, given, FABRIC_FIELDS, FABRIC_FIELDS)
    name = _text(f"{where}.name", entry["name"])
    hcas = _names(f"{where}.hcas", entry["hcas"])
    if not hcas:
        _fail(f"{where}.hcas", entry["hcas"], "must list at least one adapter")
    rate = _whole(f"{where}.rate_gbps", entry["rate_gbps"], 1)
    return FabricAttachment(name, hcas, rate)


def _fabrics(value: object) -> tuple[FabricAttachment, ...]:
    if not isinstance(value, list):
        _fail("fabrics", value, "must be a list of fabric objects")
    fabrics = tuple(_fabric(f"fabrics[{i}]", entry) for i, entry in enumerate(value))
    names: set[str] = set()
    adapters: set[str] = set()
    for i, fabric in enumerate(fabrics):
        if fabric.fabric in names:
            _fail(f"fabrics[{i}].name", fabric.fabric, "names another fabric too")
        names.add(fabric.fabric)
        for j, hca in enumerate(fabric.hcas):
            if hca in adapters:
                _fail(f"fabrics[{i}].hcas[{j}]", hca, "is cabled to another fabric too")
            adapters.add(hca)
    return tuple(sorted(fabrics, key=lambda f: f.fabric))


def _check_near_hcas(gpus: tuple[Gpu, ...], fabrics: tuple[FabricAttachment, ...]) -> None:
    """With fabrics in the file, a near HCA must be one of their adapters, as the service checks."""
    adapters = {hca for fabric in fabrics for hca in fabric.hcas}
    for i, gpu in enumerate(gpus):
        for j, hca in enumerate(gpu.near_hcas or ()):
            if hca not in adapters:
                _fail(f"gpus[{i}].near_hcas[{j}]", hca, "is no adapter of the file's fabrics")


def parse_gpus(text: str) -> tuple[Gpu, ...]:
    """The GPUs in a file's text: a JSON list of objects. Raises GpuFileError."""
    return _parse(text)[0]


def parse_gpu_file(path: str, text: str) -> GpuFile:
    """The whole file: a list of GPUs, or {"gpus": [...], "fabrics": [...]}. Raises GpuFileError."""
    gpus, xids, fabrics = _parse(text)
    return GpuFile(path, gpus, xids, fabrics)


def _parse(
    text: str,
) -> tuple[tuple[Gpu, ...], dict[int, tuple[int, ...]], tuple[FabricAttachment, ...] | None]:
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise GpuFileError(f"not valid JSON: {e}") from e
    fabrics: tuple[FabricAttachment, ...] | None = None
    prefix = ""
    if isinstance(document, dict):
        for key in document:
            if key not in FILE_FIELDS:
                _fail(key, document[key], f"unknown field; known: {', '.join(FILE_FIELDS)}")
        if "gpus" not in document:
            raise GpuFileError("an object file needs gpus: the list of GPU objects")
        listed = document["gpus"]
        prefix = "gpus"
        if "fabrics" in document:
            fabrics = _fabrics(document["fabrics"])
    else:
        listed = document
    if not isinstance(listed, list):
        raise GpuFileError(
            "must be a JSON list of GPU objects, or an object with gpus (and fabrics)"
        )
    gpus, xids = _parse_gpus(listed, prefix)
    if fabrics is not None:
        _check_near_hcas(gpus, fabrics)
    return gpus, xids, fabrics


def _parse_gpus(
    listed: list[object], prefix: str
) -> tuple[tuple[Gpu, ...], dict[int, tuple[int, ...]]]:
    gpus = tuple(_gpu(f"{prefix}[{i}]", entry) for i, entry in enumerate(listed))
    xids = {
        gpu.index: _xids(f"{prefix}[{i}].xids", entry["xids"])
        for i, (gpu, entry) in enumerate(zip(gpus, listed, strict=True))
        if isinstance(entry, dict) and "xids" in entry
    }
    xids = {index: heard for index, heard in xids.items() if heard}
    for unique in ("index", "uuid", "pci_bus_id"):
        seen: set[object] = set()
        for i, gpu in enumerate(gpus):
            value = getattr(gpu, unique)
            if value is not None and value in seen:
                _fail(f"{prefix}[{i}].{unique}", value, "names another GPU too")
            seen.add(value)
    _check_peers(gpus, prefix)
    return gpus, xids


def read_gpu_file(path: str) -> GpuFile:
    """The GPUs listed in the file at `path`. Raises GpuFileError."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise GpuFileError(f"cannot read the GPU file: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise GpuFileError(f"not UTF-8 text: {e.reason}") from e
    return parse_gpu_file(path, text)
