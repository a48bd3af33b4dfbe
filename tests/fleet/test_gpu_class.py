"""Schedulers ask for GPU classes; the class must come out the same for the same card, always."""

import pytest

from service.fleet.gpu_class import derive_gpu_class


@pytest.mark.parametrize(
    ("name", "memory_mb", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-SXM4-40GB", None, "A100-40GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA L40S", 46068, "L40S-48GB"),
        ("Tesla T4", 15360, "T4-16GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX4090-24GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA H100 NVL", 95830, "H100-94GB"),
        ("NVIDIA A10G", 23028, "A10G-24GB"),
    ],
)
def test_real_driver_names_map_to_the_class_schedulers_ask_for(
    name: str, memory_mb: int | None, expected: str
) -> None:
    assert derive_gpu_class(name, memory_mb) == expected


def test_an_unknown_card_still_gets_a_stable_class() -> None:
    first = derive_gpu_class("Acme Tensor Blaster 9000", 65536)
    assert first == derive_gpu_class("Acme Tensor Blaster 9000", 65536)
    assert first == "ACME-64GB"
    assert derive_gpu_class("", None) == "UNKNOWN"
    assert derive_gpu_class("NVIDIA H200", None) == "H200"
