from pydantic import Field

from .base_model import BaseModel


class FitGroup(BaseModel):
    fit_group: "FitGroupFitGroup" = Field(alias="fitGroup")


class FitGroupFitGroup(BaseModel):
    groups: int
    limited_by: list[str] = Field(alias="limitedBy")


FitGroup.model_rebuild()
