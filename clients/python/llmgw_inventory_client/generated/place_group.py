from typing import Literal, Union

from pydantic import Field

from .base_model import BaseModel
from .fragments import (  # noqa: F401
    AllocationRejected,
    GroupPlaced,
    GroupPlacedKvPaths,
    GroupPlacedMembers,
    Unplaceable,
    UnplaceableRoles,
    UnplaceableVerdicts,
)


class PlaceGroup(BaseModel):
    place_group: Union[
        "PlaceGroupPlaceGroupGroupPlaced",
        "PlaceGroupPlaceGroupUnplaceable",
        "PlaceGroupPlaceGroupAllocationRejected",
    ] = Field(alias="placeGroup", discriminator="typename__")


class PlaceGroupPlaceGroupGroupPlaced(GroupPlaced):
    typename__: Literal["GroupPlaced"] = Field(alias="__typename")


class PlaceGroupPlaceGroupUnplaceable(Unplaceable):
    typename__: Literal["Unplaceable"] = Field(alias="__typename")


class PlaceGroupPlaceGroupAllocationRejected(AllocationRejected):
    typename__: Literal["AllocationRejected"] = Field(alias="__typename")


PlaceGroup.model_rebuild()
