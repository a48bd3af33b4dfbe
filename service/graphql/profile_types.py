"""Hardware profiles as GraphQL types (service/fleet/health/drift.py); DriftFinding is in health_types."""

from __future__ import annotations

import strawberry

from service.fleet.health import drift

from .inputs import KeyValueInput
from .types import KeyValue


@strawberry.type(description="What the nodes a label selects should have; null: not said.")
class HardwareProfile:
    name: str
    selector: KeyValue
    gpu_count: int | None
    gpu_class: str | None
    hca_count: int | None
    hca_rate_gbps: int | None
    nvlink_group_size: int | None
    memory_total_mb: int | None

    @classmethod
    def of(cls, p: drift.HardwareProfile) -> HardwareProfile:
        return cls(
            name=p.name,
            selector=KeyValue(key=p.selector[0], value=p.selector[1]),
            gpu_count=p.gpu_count,
            gpu_class=p.gpu_class,
            hca_count=p.hca_count,
            hca_rate_gbps=p.hca_rate_gbps,
            nvlink_group_size=p.nvlink_group_size,
            memory_total_mb=p.memory_total_mb,
        )


@strawberry.input
class HardwareProfileInput:
    name: str
    selector: KeyValueInput = strawberry.field(
        description="The profile applies to nodes with this label."
    )
    gpu_count: int | None = None
    gpu_class: str | None = None
    hca_count: int | None = None
    hca_rate_gbps: int | None = None
    nvlink_group_size: int | None = None
    memory_total_mb: int | None = None

    def to_profile(self) -> drift.HardwareProfile:
        return drift.HardwareProfile(
            name=self.name,
            selector=(self.selector.key, self.selector.value),
            gpu_count=self.gpu_count,
            gpu_class=self.gpu_class,
            hca_count=self.hca_count,
            hca_rate_gbps=self.hca_rate_gbps,
            nvlink_group_size=self.nvlink_group_size,
            memory_total_mb=self.memory_total_mb,
        )
