"""A stand-in for the `pynvml` module, with the real module's names.

Only the names the agent calls are defined, so an agent calling anything else
fails here with AttributeError; a test checks that each of these names exists
in the real binding too, so the fake cannot drift into an NVML that does not exist.
"""

import ctypes
import queue
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

_MIB = 1 << 20


class NVMLError(Exception):
    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return type(self).__name__.removeprefix("NVMLError_")


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_NoPermission(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


class NVMLError_FunctionNotFound(NVMLError):
    pass


class NVMLError_Unknown(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLLibraryMismatchError(Exception):
    """Raised by the binding itself (not an NVMLError) when the driver lacks a _v3 call."""


ERRORS = {
    cls.__name__: cls
    for cls in (
        NVMLLibraryMismatchError,
        NVMLError,
        NVMLError_LibraryNotFound,
        NVMLError_DriverNotLoaded,
        NVMLError_NotSupported,
        NVMLError_NoPermission,
        NVMLError_GpuIsLost,
        NVMLError_FunctionNotFound,
        NVMLError_Unknown,
        NVMLError_InvalidArgument,
        NVMLError_Timeout,
    )
}
CONSTANTS = {
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_FEATURE_ENABLED": 1,
    # The real binding's values (a test compares them).
    "NVML_NVLINK_MAX_LINKS": 36,
    "NVML_NVLINK_DEVICE_TYPE_GPU": 0,
    "NVML_NVLINK_DEVICE_TYPE_SWITCH": 2,
    "NVML_GPU_FABRIC_STATE_COMPLETED": 3,
    "nvmlEventTypeXidCriticalError": 8,
    # The driver's recovery action, as a field value (nvidia-ml-py 13 has no
    # nvmlDeviceGetGpuRecoveryAction of its own).
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": 230,
    "NVML_SUCCESS": 0,
    "NVML_ERROR_NOT_SUPPORTED": 3,
}
NVLINK_GPU, NVLINK_SWITCH = 0, 2


class c_nvmlGpuFabricInfoV_t(ctypes.Structure):
    """The binding's struct: the agent allocates it and passes it by reference."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    ]


STRUCTS = {"c_nvmlGpuFabricInfoV_t": c_nvmlGpuFabricInfoV_t}


@dataclass(frozen=True)
class Fabric:
    """What nvmlDeviceGetGpuFabricInfoV reports for a GPU in a multi-node NVLink domain."""

    cluster_uuid: bytes
    clique_id: int
    state: int = 3  # NVML_GPU_FABRIC_STATE_COMPLETED


@dataclass
class FakeGpu:
    """One GPU: each figure is its answer, or the exception NVML raises for it."""

    name: Any = "NVIDIA H100 80GB HBM3"
    memory_mib: Any = 81559
    uuid: Any = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: Any = "00000000:18:00.0"
    ecc_uncorrected: Any = 0
    remapped_rows: Any = (0, 0, 0, 0)
    # Page retirement is pre-Ampere: an H100 says NotSupported.
    retired_pending: Any = field(default_factory=NVMLError_NotSupported)
    processes: Any = field(default_factory=list)  # pids, or an exception
    handle_error: Exception | None = None
    # NVLink: one entry per link, None when inactive, else (remote device
    # type, remote PCI bus id); or the exception every link raises. Past the
    # last link the driver says InvalidArgument. No NVLink: NotSupported.
    nvlinks: Any = field(default_factory=NVMLError_NotSupported)
    # GPU fabric info (multi-node NVLink): a Fabric, or the exception.
    fabric: Any = field(default_factory=NVMLError_NotSupported)
    # What nvmlDeviceRegisterEvents raises for it (NotSupported on some GPUs).
    events_error: Exception | None = None
    # The driver's recovery action (nvmlGpuRecoveryAction_t: 0 NONE, 1 GPU_RESET,
    # 2 NODE_REBOOT, 3 DRAIN_P2P, 4 DRAIN_AND_RESET...), or None when the driver
    # does not know the field (NVML_ERROR_NOT_SUPPORTED in the field's return).
    recovery_action: int | None = 0

    def answer(self, value: Any) -> Any:
        if isinstance(value, BaseException):
            raise value
        return value


def h100(index: int, **figures: Any) -> FakeGpu:
    figures.setdefault("uuid", f"GPU-h100-{index}")
    figures.setdefault("bus_id", f"00000000:{0x18 + index:02X}:00.0")
    return FakeGpu(**figures)


def h200(index: int = 0, **figures: Any) -> FakeGpu:
    figures.setdefault("uuid", f"GPU-h200-{index}")
    return FakeGpu(name="NVIDIA H200", memory_mib=143771, **figures)


def t4(index: int = 0, **figures: Any) -> FakeGpu:
    # A T4 has no row remapping; it retires pages instead.
    figures.setdefault("uuid", f"GPU-t4-{index}")
    figures.setdefault("remapped_rows", NVMLError_NotSupported())
    figures.setdefault("retired_pending", 0)
    return FakeGpu(name="Tesla T4", memory_mib=15360, **figures)


class FakeNvml:
    """The module: `discover_gpus(FakeNvml([...]), ...)`."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        init_error: Exception | None = None,
        driver_before_r510: bool = False,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver_before_r510 = driver_before_r510
        self.initialized = False
        self.shut_down = False
        # XID events the driver will deliver: (GPU index, XID), via raise_xid.
        self.xid_events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.event_sets: list[list[FakeGpu]] = []
        for name, value in {**ERRORS, **CONSTANTS, **STRUCTS}.items():
            setattr(self, name, value)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def nvmlShutdown(self) -> None:
        assert self.initialized, "nvmlShutdown without a successful nvmlInit"
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        if gpu.handle_error is not None:
            raise gpu.handle_error
        return gpu

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> Any:
        return gpu.answer(gpu.name)

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> Any:
        return gpu.answer(gpu.uuid)

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> Any:
        mib = gpu.answer(gpu.memory_mib)
        return SimpleNamespace(total=mib * _MIB, free=mib * _MIB, used=0)

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> Any:
        return SimpleNamespace(busId=gpu.answer(gpu.bus_id))

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0), "the agent must ask for volatile uncorrected errors"
        return int(gpu.answer(gpu.ecc_uncorrected))

    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu) -> tuple[int, int, int, int]:
        return tuple(gpu.answer(gpu.remapped_rows))  # type: ignore[return-value]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, gpu: FakeGpu) -> int:
        return int(gpu.answer(gpu.retired_pending))

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[Any]:
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in gpu.answer(gpu.processes)
        ]

    def _link(self, gpu: FakeGpu, link: int) -> Any:
        links = gpu.answer(gpu.nvlinks)
        if link >= len(links):
            raise NVMLError_InvalidArgument()
        return links[link]

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        return 0 if self._link(gpu, link) is None else 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, gpu: FakeGpu, link: int) -> int:
        found = self._link(gpu, link)
        assert found is not None, "the agent asked about an inactive link"
        return int(found[0])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, gpu: FakeGpu, link: int) -> Any:
        found = self._link(gpu, link)
        assert found is not None, "the agent asked about an inactive link"
        return SimpleNamespace(busId=found[1])

    def nvmlDeviceGetGpuFabricInfoV(self, gpu: FakeGpu, info: Any) -> int:
        fabric = gpu.answer(gpu.fabric)
        struct = info._obj  # ctypes.byref(struct), as the real binding takes it
        assert isinstance(struct, c_nvmlGpuFabricInfoV_t)
        for i, byte in enumerate(fabric.cluster_uuid[:16]):
            struct.clusterUuid[i] = byte
        struct.cliqueId = fabric.clique_id
        struct.state = fabric.state
        return 0

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[int]) -> list[Any]:
        """As the binding answers: one value per field, each with its own nvmlReturn."""
        values = []
        for field_id in field_ids:
            assert field_id == CONSTANTS["NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"], field_id
            known = gpu.recovery_action is not None
            values.append(
                SimpleNamespace(
                    fieldId=field_id,
                    nvmlReturn=0 if known else CONSTANTS["NVML_ERROR_NOT_SUPPORTED"],
                    value=SimpleNamespace(uiVal=gpu.recovery_action or 0),
                )
            )
        return values

    def raise_xid(self, index: int, xid: int) -> None:
        """The driver reports an XID on GPU `index`, as a test's event."""
        self.xid_events.put((index, xid))

    # XID events: one event set, the GPUs registered on it, and a wait.

    def nvmlEventSetCreate(self) -> list[FakeGpu]:
        event_set: list[FakeGpu] = []
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(
        self, gpu: FakeGpu, event_types: int, event_set: list[FakeGpu]
    ) -> None:
        assert event_types == CONSTANTS["nvmlEventTypeXidCriticalError"]
        if gpu.events_error is not None:
            raise gpu.events_error
        event_set.append(gpu)

    def nvmlEventSetWait_v2(self, event_set: list[FakeGpu], timeout_ms: int) -> Any:
        try:
            index, xid = self.xid_events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout() from None
        gpu = self.gpus[index]
        assert gpu in event_set, f"an XID on GPU {index}, which is not registered for events"
        return SimpleNamespace(
            device=gpu,
            eventType=CONSTANTS["nvmlEventTypeXidCriticalError"],
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )

    def nvmlEventSetFree(self, event_set: list[FakeGpu]) -> None:
        event_set.clear()

    def nvmlDeviceGetIndex(self, gpu: FakeGpu) -> int:
        return next(i for i, g in enumerate(self.gpus) if g is gpu)


def names_the_agent_may_call() -> list[str]:
    """Every module-level name this fake offers, which the real binding must have too."""
    methods = [n for n in vars(FakeNvml) if n.startswith("nvml")]
    return sorted([*methods, *ERRORS, *CONSTANTS, *STRUCTS])
