from typing import Literal, Union

from pydantic import Field

from .base_model import BaseModel
from .fragments import (  # noqa: F401
    Allocated,
    AllocatedAllocations,
    AllocationRejected,
    Unplaceable,
    UnplaceableRoles,
    UnplaceableVerdicts,
)


class Place(BaseModel):
    place: Union[
        "PlacePlaceAllocated", "PlacePlaceUnplaceable", "PlacePlaceAllocationRejected"
    ] = Field(discriminator="typename__")


class PlacePlaceAllocated(Allocated):
    typename__: Literal["Allocated"] = Field(alias="__typename")


class PlacePlaceUnplaceable(Unplaceable):
    typename__: Literal["Unplaceable"] = Field(alias="__typename")


class PlacePlaceAllocationRejected(AllocationRejected):
    typename__: Literal["AllocationRejected"] = Field(alias="__typename")


Place.model_rebuild()
