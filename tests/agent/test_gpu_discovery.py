"""GPU discovery through NVML, against a fake pynvml with the real module's names."""

from pathlib import Path

import pynvml
import pytest
from fake_nvml import (
    FakeNvml,
    NVMLError_DriverNotLoaded,
    NVMLError_FunctionNotFound,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_NotSupported,
    NVMLError_Unknown,
    h100,
    h200,
    names_the_agent_may_call,
    t4,
)
from fake_root import add_process

from agent.config import DEFAULT_ENGINE_PROCESSES
from agent.discovery.gpus import Gpu, discover_gpus

ENGINE_PID, FOREIGN_PID = 4100, 5200


def discover(nvml: FakeNvml | None, root: Path) -> tuple[list[Gpu], list[str]]:
    warnings: list[str] = []
    gpus = discover_gpus(nvml, str(root), DEFAULT_ENGINE_PROCESSES, warnings.append)
    return gpus, warnings


@pytest.fixture
def root(tmp_path: Path) -> Path:
    add_process(
        tmp_path,
        ENGINE_PID,
        "VLLM::Worker_TP",
        ["python3", "-m", "vllm.entrypoints.openai.api_server", "--tensor-parallel-size", "8"],
    )
    add_process(tmp_path, FOREIGN_PID, "python3", ["python3", "train.py", "--epochs", "3"])
    return tmp_path


def test_an_h100_node_reports_eight_gpus_and_the_two_that_are_not_free(root: Path) -> None:
    nvml = FakeNvml([h100(i, processes=[ENGINE_PID]) for i in range(8)])
    nvml.gpus[3].ecc_uncorrected = 2
    nvml.gpus[5].processes = [ENGINE_PID, FOREIGN_PID]

    gpus, warnings = discover(nvml, root)

    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.memory_mb for g in gpus} == {81559}
    assert gpus[0].uuid == "GPU-h100-0" and gpus[0].pci_bus_id == "00000000:18:00.0"
    assert gpus[3].health_reasons == ("ecc_uncorrected",)
    assert gpus[5].health_reasons == ("foreign_process",)
    assert [g.index for g in gpus if g.healthy] == [0, 1, 2, 4, 6, 7]
    assert any("5200 (python3)" in w for w in warnings), warnings
    assert nvml.shut_down


def test_an_h200_reports_its_memory_in_mib(root: Path) -> None:
    gpus, _ = discover(FakeNvml([h200()]), root)
    assert (gpus[0].name, gpus[0].memory_mb, gpus[0].healthy) == ("NVIDIA H200", 143771, True)


@pytest.mark.parametrize(
    ("comm", "argv"),
    [
        ("VLLM::EngineCor", ["VLLM::EngineCore"]),
        ("vllm", ["/opt/venv/bin/python3", "/opt/venv/bin/vllm", "serve", "/data/models/x"]),
        ("python3", ["python3", "-m", "sglang.launch_server", "--model-path", "/m"]),
        ("sglang::schedu", ["sglang::scheduler_TP0"]),
        ("trtllm-serve", ["/usr/local/bin/trtllm-serve", "/m"]),
        ("python", ["python", "-u", "-m", "tensorrt_llm.commands.serve", "/m"]),
    ],
)
def test_the_nodes_own_engine_on_a_gpu_leaves_it_healthy(
    tmp_path: Path, comm: str, argv: list[str]
) -> None:
    add_process(tmp_path, 77, comm, argv)
    gpus, _ = discover(FakeNvml([h100(0, processes=[77])]), tmp_path)
    assert gpus[0].healthy, gpus[0].health_reasons


def test_a_process_named_like_no_engine_makes_the_gpu_not_free(tmp_path: Path) -> None:
    add_process(tmp_path, 78, "python3", ["python3", "-m", "vllm_benchmarks.load", "--n", "3"])
    add_process(tmp_path, 79, "ollama", ["/usr/bin/ollama", "serve"])
    nvml = FakeNvml([h100(0, processes=[78]), h100(1, processes=[79])])
    gpus, _ = discover(nvml, tmp_path)
    assert [g.health_reasons for g in gpus] == [("foreign_process",), ("foreign_process",)]


def test_engine_names_come_from_config(tmp_path: Path) -> None:
    add_process(tmp_path, 80, "ollama", ["/usr/bin/ollama", "serve"])
    gpus = discover_gpus(FakeNvml([h100(0, processes=[80])]), str(tmp_path), ["ollama"], print)
    assert gpus[0].healthy


def test_a_process_the_agent_cannot_see_counts_as_foreign(tmp_path: Path) -> None:
    # In a container without the host's PID namespace, /proc/<pid> is absent.
    gpus, warnings = discover(FakeNvml([h100(0, processes=[31337])]), tmp_path)
    assert gpus[0].health_reasons == ("foreign_process",)
    assert any("host's PID namespace" in w for w in warnings)


def test_row_remapping_and_page_retirement_faults_are_health_reasons(root: Path) -> None:
    nvml = FakeNvml(
        [
            h100(0, remapped_rows=(12, 1, 1, 0)),
            h100(1, remapped_rows=(0, 3, 0, 1)),
            t4(2, retired_pending=1),
            h100(3, remapped_rows=(40, 0, 0, 0)),  # corrected rows alone are routine
        ]
    )
    gpus, _ = discover(nvml, root)
    assert [g.health_reasons for g in gpus] == [
        ("row_remap_pending",),
        ("row_remap_failed",),
        ("retired_pages_pending",),
        (),
    ]


def test_a_metric_the_gpu_does_not_have_is_not_a_fault(root: Path) -> None:
    # A T4 has no row remapping; ECC may be switched off; an old driver lacks a call.
    nvml = FakeNvml(
        [
            t4(0, ecc_uncorrected=NVMLError_NotSupported()),
            h100(1, retired_pending=NVMLError_FunctionNotFound()),
        ]
    )
    gpus, warnings = discover(nvml, root)
    assert [(g.name, g.memory_mb, g.healthy) for g in gpus] == [
        ("Tesla T4", 15360, True),
        ("NVIDIA H100 80GB HBM3", 81559, True),
    ]
    assert warnings == []


def test_an_nvml_error_on_one_gpu_marks_only_that_gpu(root: Path) -> None:
    nvml = FakeNvml(
        [
            h100(0),
            h100(1, ecc_uncorrected=NVMLError_Unknown()),
            h100(2, handle_error=NVMLError_GpuIsLost()),
            h100(3, processes=NVMLError_NoPermission()),
            h100(4, remapped_rows=RuntimeError("binding bug")),
            h100(5),
        ]
    )
    gpus, warnings = discover(nvml, root)

    assert [g.index for g in gpus] == [0, 1, 2, 3, 4, 5]
    assert [g.healthy for g in gpus] == [True, False, False, False, False, True]
    assert all(gpus[i].health_reasons == ("nvml_error",) for i in (1, 2, 3, 4))
    # What could still be read is reported: the name and memory of GPU 1.
    assert (gpus[1].name, gpus[1].memory_mb) == ("NVIDIA H100 80GB HBM3", 81559)
    assert gpus[2].name == "unknown"
    assert any("GPU 2" in w and "GpuIsLost" in w for w in warnings)
    assert nvml.shut_down


def test_an_older_driver_still_lists_the_processes_on_each_gpu(root: Path) -> None:
    nvml = FakeNvml(
        [h100(0, processes=[ENGINE_PID]), h100(1, processes=[FOREIGN_PID])],
        driver_before_r510=True,
    )
    gpus, _ = discover(nvml, root)
    assert [g.health_reasons for g in gpus] == [(), ("foreign_process",)]


def test_names_as_bytes_from_old_bindings_are_decoded(root: Path) -> None:
    gpu = h100(0, name=b"NVIDIA A100-SXM4-40GB", memory_mib=40960, uuid=b"GPU-a100", bus_id=b"0:1")
    gpus, _ = discover(FakeNvml([gpu]), root)
    assert (gpus[0].name, gpus[0].uuid, gpus[0].pci_bus_id) == (
        "NVIDIA A100-SXM4-40GB",
        "GPU-a100",
        "0:1",
    )


@pytest.mark.parametrize("error", [NVMLError_LibraryNotFound(), NVMLError_DriverNotLoaded()])
def test_no_driver_means_no_gpus_and_one_warning(root: Path, error: Exception) -> None:
    gpus, warnings = discover(FakeNvml([h100(0)], init_error=error), root)
    assert gpus == []
    assert len(warnings) == 1 and "no NVIDIA driver" in warnings[0]


def test_nvml_refusing_to_start_means_no_gpus_not_a_crash(root: Path) -> None:
    gpus, warnings = discover(FakeNvml([h100(0)], init_error=NVMLError_NoPermission()), root)
    assert gpus == [] and len(warnings) == 1 and "NoPermission" in warnings[0]


def test_without_nvidia_ml_py_installed_there_are_no_gpus(root: Path) -> None:
    gpus, warnings = discover(None, root)
    assert gpus == [] and warnings == ["nvidia-ml-py is not installed: reporting no GPUs"]


def test_the_drivers_recovery_action_is_read_from_its_field(root: Path) -> None:
    """nvidia-ml-py 13 reads the recovery action as the field value
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (it has no nvmlDeviceGetGpuRecoveryAction)."""
    nvml = FakeNvml([h100(i) for i in range(4)])
    nvml.gpus[1].recovery_action = 2  # NODE_REBOOT
    nvml.gpus[2].recovery_action = None  # a driver before the field: unknown
    nvml.gpus[3].recovery_action = 4  # DRAIN_AND_RESET

    gpus, warnings = discover(nvml, root)

    assert [g.recovery_action for g in gpus] == ["NONE", "NODE_REBOOT", None, "DRAIN_AND_RESET"]
    assert warnings == []
    # The real binding's values, which the agent's names follow.
    assert pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT == 2
    assert pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET == 4
    assert pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION == 230


def test_the_real_binding_has_every_name_the_fake_offers() -> None:
    # The fake defines only what the agent calls; had the agent used a name the
    # real pynvml lacks, it would work here and fail on the first real node.
    missing = [name for name in names_the_agent_may_call() if not hasattr(pynvml, name)]
    assert missing == []
    assert pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED == 1 and pynvml.NVML_VOLATILE_ECC == 0
    assert pynvml.NVML_FEATURE_ENABLED == 1


def test_the_real_binding_on_this_machine_never_raises(tmp_path: Path) -> None:
    # Here there is no driver: no GPUs and a warning. On a GPU node: its GPUs.
    warnings: list[str] = []
    gpus = discover_gpus(pynvml, str(tmp_path), DEFAULT_ENGINE_PROCESSES, warnings.append)
    assert gpus or warnings
