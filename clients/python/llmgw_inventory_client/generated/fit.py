from pydantic import Field

from .base_model import BaseModel
from .enums import VerdictCode


class Fit(BaseModel):
    fit: "FitFit"


class FitFit(BaseModel):
    replicas: int
    nodes: list["FitFitNodes"]
    nodes_omitted: int = Field(alias="nodesOmitted")
    limited_by: list["FitFitLimitedBy"] = Field(alias="limitedBy")


class FitFitNodes(BaseModel):
    node_id: str = Field(alias="nodeId")
    shards: int
    gpus: int


class FitFitLimitedBy(BaseModel):
    code: VerdictCode
    nodes: int


Fit.model_rebuild()
FitFit.model_rebuild()
