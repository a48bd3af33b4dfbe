"""GPUs through NVML (`nvidia-ml-py`, imported as `pynvml`).

NVML is the one source here that can fail in many ways on a node that is
otherwise fine (no driver yet, a driver mid-upgrade, one GPU fallen off the
bus), so nothing in this module raises: no driver means no GPUs and a warning,
a fault on one GPU marks that GPU unhealthy and the others still report.
"""

import contextlib
import importlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent.discovery.resets import ResetMarks
from agent.discovery.rootfs import host_path

T = TypeVar("T")

ECC_UNCORRECTED = "ecc_uncorrected"
ROW_REMAP_PENDING = "row_remap_pending"
ROW_REMAP_FAILED = "row_remap_failed"
RETIRED_PAGES_PENDING = "retired_pages_pending"
FOREIGN_PROCESS = "foreign_process"
NVML_ERROR = "nvml_error"
# Every reason this agent reports, so a GPU file (agent.discovery.gpu_file) can only say
# what the driver could have said.
HEALTH_REASONS = (
    ECC_UNCORRECTED,
    ROW_REMAP_PENDING,
    ROW_REMAP_FAILED,
    RETIRED_PAGES_PENDING,
    FOREIGN_PROCESS,
    NVML_ERROR,
)

_MIB = 1 << 20

# nvmlGpuRecoveryAction_t, by value: what the driver says a GPU needs (what an
# XID 154 announces). The service maps it to a remediation.
RECOVERY_ACTIONS = {
    0: "NONE",
    1: "GPU_RESET",
    2: "NODE_REBOOT",
    3: "DRAIN_P2P",
    4: "DRAIN_AND_RESET",
    5: "RECOVER_IMEX_DOMAIN",
    6: "BUS_RESET",
    7: "SYSTEM_REBOOT",
}


@dataclass(frozen=True)
class Gpu:
    index: int
    # As the driver names it; "unknown" only when NVML could not say.
    name: str
    uuid: str | None = None
    memory_mb: int | None = None
    pci_bus_id: str | None = None
    health_reasons: tuple[str, ...] = ()
    # Topology (agent.discovery.topology); None is "could not tell", never "none".
    numa_node: int | None = None
    nvlink_peers: tuple[int, ...] | None = None
    nvlink_domain: str | None = None
    near_hcas: tuple[str, ...] | None = None
    # The driver's recovery action (RECOVERY_ACTIONS' names); None when the
    # driver or binding cannot say.
    recovery_action: str | None = None
    # What a reset changes, as this scan read it (agent/discovery/resets.py):
    # compared with the next scan's, not with another GPU's.
    reset_marks: ResetMarks | None = field(default=None, compare=False)

    @property
    def healthy(self) -> bool:
        return not self.health_reasons


def load_nvml() -> Any | None:
    """The pynvml module, or None when nvidia-ml-py is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _error_class(nvml: Any, name: str) -> type[BaseException]:
    # Old bindings lack some of the classes; a missing one must match nothing
    # rather than make every GPU unreadable.
    found = getattr(nvml, name, None)
    return found if isinstance(found, type) else _NeverRaised


class _NeverRaised(Exception):
    pass


def _describe(error: BaseException) -> str:
    # NVMLError.__str__ asks the library for the message, which can itself fail.
    try:
        text = str(error)
    except Exception:
        text = ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _text(value: object) -> str:
    # Older bindings return bytes for names, UUIDs and bus ids.
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class _GpuQueries:
    """Asks NVML about one GPU, turning each failure into a fact about that GPU."""

    def __init__(self, nvml: Any, index: int) -> None:
        self.nvml = nvml
        self.index = index
        self.faults: list[str] = []
        # The GPU simply has no such counter (ECC off, a T4 has no row
        # remapping) or the driver predates the call: nothing is wrong with it.
        self._unavailable = (
            _error_class(nvml, "NVMLError_NotSupported"),
            _error_class(nvml, "NVMLError_FunctionNotFound"),
        )

    def ask(self, what: str, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except self._unavailable:
            return None
        except Exception as e:
            # Any other failure, NVML's or the binding's, is this GPU's fault
            # alone: record it and go on to the next metric and the next GPU.
            self.faults.append(f"GPU {self.index}: {what} failed ({_describe(e)})")
            return None


def discover_gpus(
    nvml: Any | None,
    root: str,
    engine_processes: Iterable[str],
    warn: Callable[[str], None],
) -> list[Gpu]:
    """Every GPU NVML sees, with its health; [] when there is no driver.

    `nvml` is the pynvml module (or a stand-in with the same names), None when
    nvidia-ml-py is not installed.
    """
    if nvml is None:
        warn("nvidia-ml-py is not installed: reporting no GPUs")
        return []
    no_driver = (
        _error_class(nvml, "NVMLError_LibraryNotFound"),
        _error_class(nvml, "NVMLError_DriverNotLoaded"),
    )
    try:
        nvml.nvmlInit()
    except no_driver as e:
        warn(f"no NVIDIA driver ({_describe(e)}): reporting no GPUs")
        return []
    except Exception as e:
        warn(f"NVML did not start ({_describe(e)}): reporting no GPUs")
        return []
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as e:
            warn(f"NVML could not count the GPUs ({_describe(e)}): reporting no GPUs")
            return []
        engines = tuple(e.lower() for e in engine_processes)
        return [_read_gpu(nvml, index, root, engines, warn) for index in range(count)]
    finally:
        # Shutting down is tidiness; failing to must not lose the report.
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _read_gpu(
    nvml: Any, index: int, root: str, engines: tuple[str, ...], warn: Callable[[str], None]
) -> Gpu:
    q = _GpuQueries(nvml, index)
    handle = q.ask("getting its handle", lambda: nvml.nvmlDeviceGetHandleByIndex(index))
    if handle is None:
        for fault in q.faults:
            warn(fault)
        return Gpu(index=index, name="unknown", health_reasons=(NVML_ERROR,))

    name = q.ask("name", lambda: _text(nvml.nvmlDeviceGetName(handle)))
    uuid = q.ask("UUID", lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
    memory = q.ask("memory", lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB)
    bus_id = q.ask("PCI bus id", lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId))

    reasons: list[str] = []
    ecc = q.ask(
        "uncorrected ECC errors",
        lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
    )
    if ecc:
        reasons.append(ECC_UNCORRECTED)
    # (corrected, uncorrected, pending, failed) on A100 and later.
    rows = q.ask("remapped rows", lambda: tuple(nvml.nvmlDeviceGetRemappedRows(handle)))
    if rows is not None and len(rows) >= 4:
        if rows[2]:
            reasons.append(ROW_REMAP_PENDING)
        if rows[3]:
            reasons.append(ROW_REMAP_FAILED)
    # Page retirement is the pre-Ampere mechanism (V100, T4); newer GPUs say NotSupported.
    retired = q.ask("retired pages", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
    if retired == getattr(nvml, "NVML_FEATURE_ENABLED", 1):
        reasons.append(RETIRED_PAGES_PENDING)
    processes = q.ask("compute processes", lambda: _compute_processes(nvml, handle))
    foreign = [p for p in processes or [] if not _is_engine(root, int(p.pid), engines, warn)]
    if foreign:
        reasons.append(FOREIGN_PROCESS)
        names = ", ".join(f"{p.pid} ({_process_label(root, int(p.pid))})" for p in foreign)
        warn(f"GPU {index}: used by a process that is not the node's engine: {names}")

    recovery = q.ask("recovery action", lambda: _recovery_action(nvml, handle, warn))
    marks = ResetMarks(
        volatile_uncorrected_ecc=None if ecc is None else int(ecc),
        remap_pending=None if rows is None or len(rows) < 4 else bool(rows[2]),
        retired_pages_pending=(
            None if retired is None else retired == getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        ),
        recovery_action=recovery,
    )

    for fault in q.faults:
        warn(fault)
    if q.faults:
        reasons.append(NVML_ERROR)
    return Gpu(
        index=index,
        name=name or "unknown",
        uuid=uuid,
        memory_mb=memory,
        pci_bus_id=bus_id,
        health_reasons=tuple(reasons),
        recovery_action=recovery,
        reset_marks=marks,
    )


def _recovery_action(nvml: Any, handle: Any, warn: Callable[[str], None]) -> str | None:
    """What the driver says the GPU needs (RECOVERY_ACTIONS), or None when it cannot say.

    Through nvmlDeviceGetGpuRecoveryAction where the binding has one, else the
    field value NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvidia-ml-py 13 has only
    the field: R565 drivers and later); an older binding or driver answers
    nothing, which is unknown, not NONE.
    """
    direct = getattr(nvml, "nvmlDeviceGetGpuRecoveryAction", None)
    if direct is not None:
        code = int(direct(handle))
    else:
        field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is None:
            return None
        [value] = nvml.nvmlDeviceGetFieldValues(handle, [field])
        if value.nvmlReturn != getattr(nvml, "NVML_SUCCESS", 0):
            return None
        code = int(value.value.uiVal)
    found = RECOVERY_ACTIONS.get(code)
    if found is None:
        warn(f"the driver names recovery action {code}, which this agent does not know")
    return found


def _compute_processes(nvml: Any, handle: Any) -> list[Any]:
    """The GPU's compute processes, on drivers older than the binding too.

    nvidia-ml-py calls the _v3 function, which drivers before R510 lack; it
    then raises NVMLLibraryMismatchError, and the _v2 function answers the
    same question. Without either, the GPU's users are unknown: nvml_error.
    """
    try:
        return list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except _error_class(nvml, "NVMLLibraryMismatchError"):
        older = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v2", None)
        if older is None:
            raise
        return list(older(handle))


def _read_proc(root: str, pid: int, name: str) -> str | None:
    try:
        return host_path(root, f"/proc/{pid}/{name}").read_text(errors="replace")
    except OSError:
        return None


def _process_label(root: str, pid: int) -> str:
    comm = _read_proc(root, pid, "comm")
    return comm.strip() if comm else "unknown"


def process_names(root: str, pid: int) -> list[str] | None:
    """The names a process goes by, or None when it cannot be seen.

    The comm (which vLLM and SGLang rename to e.g. `VLLM::EngineCore`), the
    program, and for a Python interpreter the module after -m or the script:
    `python -m vllm.entrypoints.openai.api_server` is vLLM, not "python".
    """
    comm = _read_proc(root, pid, "comm")
    cmdline = _read_proc(root, pid, "cmdline")
    if comm is None and cmdline is None:
        return None
    names = [comm.strip()] if comm and comm.strip() else []
    argv = [a for a in (cmdline or "").split("\0") if a]
    if argv:
        names.append(os.path.basename(argv[0]))
        if os.path.basename(argv[0]).startswith("python"):
            names.extend(_python_target(argv[1:]))
    return names


def _python_target(args: list[str]) -> list[str]:
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            return [args[i + 1]]
        if arg.startswith("-m") and len(arg) > 2:
            return [arg[2:]]
        if not arg.startswith("-"):
            return [os.path.basename(arg)]
    return []


def _is_engine(root: str, pid: int, engines: tuple[str, ...], warn: Callable[[str], None]) -> bool:
    names = process_names(root, pid)
    if names is None:
        # Counted as foreign: a GPU wrongly marked busy is visible and harmless,
        # one wrongly marked free gets a second model loaded onto it.
        warn(
            f"cannot see process {pid} under {root.rstrip('/')}/proc: "
            "run the agent in the host's PID namespace"
        )
        return False
    # `VLLM::EngineCor` -> vllm, `vllm.entrypoints.openai` -> vllm, `trtllm-serve` stays whole.
    stems = {re.split(r"[.:]", name.lower(), maxsplit=1)[0] for name in names}
    return any(engine in stems for engine in engines)
