from typing import Optional

from pydantic import Field

from .base_model import BaseModel
from .fragments import PlacementVerdict


class ExplainPlacement(BaseModel):
    explain_placement: "ExplainPlacementExplainPlacement" = Field(
        alias="explainPlacement"
    )


class ExplainPlacementExplainPlacement(BaseModel):
    placeable: bool
    message: str
    fabric: Optional[str]
    nvlink_domain: Optional[str] = Field(alias="nvlinkDomain")
    plan: list["ExplainPlacementExplainPlacementPlan"]
    verdicts: list["ExplainPlacementExplainPlacementVerdicts"]
    verdicts_omitted: int = Field(alias="verdictsOmitted")


class ExplainPlacementExplainPlacementPlan(BaseModel):
    shard_id: str = Field(alias="shardId")
    node_id: str = Field(alias="nodeId")
    gpu_count: int = Field(alias="gpuCount")


ExplainPlacementExplainPlacementVerdicts = PlacementVerdict
ExplainPlacement.model_rebuild()
ExplainPlacementExplainPlacement.model_rebuild()
