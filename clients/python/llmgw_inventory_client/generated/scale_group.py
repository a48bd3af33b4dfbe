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


class ScaleGroup(BaseModel):
    scale_group: Union[
        "ScaleGroupScaleGroupGroupPlaced",
        "ScaleGroupScaleGroupUnplaceable",
        "ScaleGroupScaleGroupAllocationRejected",
    ] = Field(alias="scaleGroup", discriminator="typename__")


class ScaleGroupScaleGroupGroupPlaced(GroupPlaced):
    typename__: Literal["GroupPlaced"] = Field(alias="__typename")


class ScaleGroupScaleGroupUnplaceable(Unplaceable):
    typename__: Literal["Unplaceable"] = Field(alias="__typename")


class ScaleGroupScaleGroupAllocationRejected(AllocationRejected):
    typename__: Literal["AllocationRejected"] = Field(alias="__typename")


ScaleGroup.model_rebuild()
