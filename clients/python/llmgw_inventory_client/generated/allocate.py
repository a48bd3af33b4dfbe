from typing import Literal, Union

from pydantic import Field

from .base_model import BaseModel
from .fragments import (
    Allocated,
    AllocatedAllocations,  # noqa: F401
    AllocationRejected,
)


class Allocate(BaseModel):
    allocate: Union[
        "AllocateAllocateAllocated", "AllocateAllocateAllocationRejected"
    ] = Field(discriminator="typename__")


class AllocateAllocateAllocated(Allocated):
    typename__: Literal["Allocated"] = Field(alias="__typename")


class AllocateAllocateAllocationRejected(AllocationRejected):
    typename__: Literal["AllocationRejected"] = Field(alias="__typename")


Allocate.model_rebuild()
