"""A node read from its row is the same record, and the same views, however it is built.

service/fleet/node_reads.node_from_row sets the record's fields in one dict
update instead of the dataclass's __init__ (half of reading a row); a field
added to NodeRecord and forgotten there must fail here, not read as missing.
"""

from __future__ import annotations

import dataclasses

from sqlalchemy.ext.asyncio import AsyncEngine

from service.database import connections
from service.fleet.node_reads import NodeRecord, get_nodes
from service.fleet.reports import Disk
from tests.support.api import Api
from tests.support.reports import REGISTER, node_input


async def test_a_node_read_from_its_row_has_every_field_and_its_views(
    api: Api, engine: AsyncEngine
) -> None:
    report = node_input(
        "gpu-01",
        labels=[{"key": "zone", "value": "z1"}, {"key": "rack", "value": "r7"}],
        engineVersions=[{"key": "vllm", "value": "0.11.0"}],
        storage=[
            {"id": "nvme0", "mountPoint": "/models", "shared": False,
             "freeBytes": 40 * 10**9, "totalBytes": 4 * 10**12},
        ],
    )  # fmt: skip
    await api(REGISTER, {"input": report})

    async with connections.autocommit(engine) as conn:
        record = (await get_nodes(conn, ["gpu-01"]))["gpu-01"]

    names = {field.name for field in dataclasses.fields(NodeRecord)}
    assert set(vars(record)) == names, "node_from_row sets exactly the dataclass's fields"
    rebuilt = NodeRecord(**{name: getattr(record, name) for name in names})
    assert rebuilt == record

    assert record.labels == {label["key"]: label["value"] for label in report["labels"]}
    assert record.engine_versions == {
        version["key"]: version["value"] for version in report["engineVersions"]
    }
    assert record.local_disk == Disk(40 * 10**9, 4 * 10**12)
    assert record.shared_disk is None, "no shared filesystem reported: unknown, not zero"
    assert record.schedulable
