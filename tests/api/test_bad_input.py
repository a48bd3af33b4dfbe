"""A broken or hostile report gets an error naming the field and the value, and the stored report stays whole."""

from __future__ import annotations

from typing import Any

import pytest

from service.errors import shown
from tests.support.api import Api
from tests.support.reports import GB, H100, REGISTER, TB, gpus, node_input

SNAPSHOT = """
query($id: ID!) { node(id: $id) {
  hostname labels { key value } gpus { index name healthy } fabrics { fabric }
  storage { id freeBytes } weights { path } localDisk { freeBytes totalBytes }
} }
"""

GOOD_STORAGE = [
    {"id": "dev:8:1", "mountPoint": "/", "shared": False, "freeBytes": GB, "totalBytes": 2 * GB}
]


def disk(**overrides: Any) -> list[dict[str, Any]]:
    return [{**GOOD_STORAGE[0], **overrides}]


BAD_REPORTS: list[tuple[str, dict[str, Any], str, Any]] = [
    ("negative GPU index", {"gpus": gpus(H100, 1, index=-1)}, "input.gpus[0].index", -1),
    (
        "repeated GPU index",
        {"gpus": [*gpus(H100, 2), {**gpus(H100, 1)[0], "index": 1}]},
        "input.gpus[2].index",
        1,
    ),
    (
        "free bytes above total",
        {"storage": disk(freeBytes=3 * GB)},
        "input.storage[0].freeBytes",
        3 * GB,
    ),
    (
        "one filesystem listed twice",
        {"storage": [*GOOD_STORAGE, {**GOOD_STORAGE[0], "mountPoint": "/again"}]},
        "input.storage[1].id",
        "dev:8:1",
    ),
    (
        "negative rate",
        {"fabrics": [{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": -400}]},
        "input.fabrics[0].rateGbps",
        -400,
    ),
    ("negative memory", {"memoryTotalMb": -1}, "input.memoryTotalMb", -1),
    ("negative GPU memory", {"gpus": gpus(H100, 1, memoryMb=-5)}, "input.gpus[0].memoryMb", -5),
    ("empty hostname", {"hostname": ""}, "input.hostname", ""),
    # A long value is repeated as a short prefix (errors.shown), never whole.
    ("over-long hostname", {"hostname": "h" * 254}, "input.hostname", shown("h" * 254)),
    ("too many GPUs", {"gpus": gpus(H100, 65)}, "input.gpus", "65 entries"),
    (
        "too many labels",
        {"labels": [{"key": f"k{i}", "value": "v"} for i in range(65)]},
        "input.labels",
        "65 entries",
    ),
    (
        "too many filesystems",
        {"storage": [{**GOOD_STORAGE[0], "id": f"dev:{i}"} for i in range(65)]},
        "input.storage",
        "65 entries",
    ),
    (
        "label key twice",
        {"labels": [{"key": "zone", "value": "a"}, {"key": "zone", "value": "b"}]},
        "input.labels[1].key",
        "zone",
    ),
    (
        "a healthy GPU with a health reason",
        {"gpus": [*gpus(H100, 1), {**gpus(H100, 2)[1], "healthReasons": ["ecc_uncorrected"]}]},
        "input.gpus[1].healthReasons",
        "['ecc_uncorrected']",
    ),
    (
        "empty weights path",
        {"weights": [{"path": " "}]},
        "input.weights[0].path",
        " ",
    ),
]


@pytest.fixture
async def stored(api: Api) -> dict[str, Any]:
    """gpu-07 with a full, good report; every bad report below must leave it exactly so."""
    report = node_input(
        "gpu-07",
        labels=[{"key": "zone", "value": "z1"}],
        fabrics=[{"fabric": "ib-a", "hcas": ["mlx5_0"], "rateGbps": 400}],
        storage=[
            {"id": "dev:259:1", "mountPoint": "/data", "shared": False,
             "freeBytes": TB, "totalBytes": 2 * TB},
        ],
        weights=[{"path": "/data/models/llama-70b"}],
    )  # fmt: skip
    await api(REGISTER, {"input": report})
    before: dict[str, Any] = (await api(SNAPSHOT, {"id": "gpu-07"}))["node"]
    return before


@pytest.mark.parametrize(
    ("story", "fields", "field", "value"), BAD_REPORTS, ids=[b[0] for b in BAD_REPORTS]
)
async def test_a_bad_report_names_the_field_and_changes_nothing(
    api: Api, stored: dict[str, Any], story: str, fields: dict[str, Any], field: str, value: Any
) -> None:
    error = await api.fails(REGISTER, {"input": node_input("gpu-07", **fields)})

    assert error["extensions"]["code"] == "BAD_INPUT", error
    assert error["extensions"]["field"] == field
    assert error["extensions"]["value"] == value
    assert field in error["message"]
    assert (await api(SNAPSHOT, {"id": "gpu-07"}))["node"] == stored


@pytest.mark.parametrize(
    ("node_id", "shown"),
    [("", ""), ("x" * 254, shown("x" * 254)), (" gpu-07", " gpu-07")],
    ids=["empty", "over-long", "padded"],
)
async def test_a_bad_node_id_is_refused_and_nothing_is_created(
    api: Api, node_id: str, shown: str
) -> None:
    error = await api.fails(REGISTER, {"input": node_input(node_id)})
    assert error["extensions"] == {"code": "BAD_INPUT", "field": "input.id", "value": shown}
    assert (await api("{ nodes { id } }"))["nodes"] == []


async def test_an_unknown_enum_value_is_a_clear_graphql_error(api: Api) -> None:
    error = await api.fails("{ nodes(filter: {state: SLEEPING}) { id } }")
    assert "SLEEPING" in error["message"] and "NodeState" in error["message"]


async def test_a_byte_count_must_be_a_whole_non_negative_number(api: Api) -> None:
    for bad in (-1, 1.5, "10GB", True):
        error = await api.fails(
            REGISTER, {"input": node_input("gpu-07", storage=disk(freeBytes=bad))}
        )
        assert "Bytes" in error["message"] and "freeBytes" in error["message"], error
    assert (await api("{ nodes { id } }"))["nodes"] == []


async def test_byte_counts_beyond_32_bits_round_trip(api: Api) -> None:
    big = 18 * 10**15  # an 18 PB filer
    storage = [
        {"id": "fs", "mountPoint": "/f", "shared": True, "freeBytes": big, "totalBytes": big}
    ]
    await api(REGISTER, {"input": node_input("gpu-07", storage=storage)})
    data = await api('{ node(id: "gpu-07") { sharedDisk { freeBytes totalBytes } } }')
    assert data["node"]["sharedDisk"] == {"freeBytes": big, "totalBytes": big}


FREE = '{ freeGpus(gpuClass: "H100-80GB") { node { id } gpuIndices } }'


async def test_a_gpu_that_says_healthy_and_faulty_is_never_offered(api: Api) -> None:
    contradictory = [{**gpu, "healthReasons": ["ecc_uncorrected"]} for gpu in gpus(H100, 2)]
    error = await api.fails(REGISTER, {"input": node_input("gpu-07", gpus=contradictory)})
    assert error["extensions"]["field"] == "input.gpus[0].healthReasons"
    assert "ecc_uncorrected" in error["message"] and "healthy" in error["message"]
    assert (await api(FREE))["freeGpus"] == []
    assert (await api("{ nodes { id } }"))["nodes"] == []


async def test_an_unknown_reason_on_an_unhealthy_gpu_is_kept_as_sent(api: Api) -> None:
    # A newer agent may know a fault this service does not: stored, and the GPU not offered.
    report = [*gpus(H100, 1), {**gpus(H100, 2)[1], "healthy": False,
                               "healthReasons": ["nvlink_crc_storm"]}]  # fmt: skip
    await api(REGISTER, {"input": node_input("gpu-07", gpus=report)})
    node = (await api('{ node(id: "gpu-07") { gpus { index healthy healthReasons } } }'))["node"]
    assert node["gpus"][1] == {"index": 1, "healthy": False, "healthReasons": ["nvlink_crc_storm"]}
    assert (await api(FREE))["freeGpus"] == [{"node": {"id": "gpu-07"}, "gpuIndices": [0]}]
