from typing import Optional

from pydantic import Field

from .base_model import BaseModel
from .enums import KvPathKind, LocalityLevel
from .fragments import PlacementVerdict


class ExplainGroupPlacement(BaseModel):
    explain_group_placement: "ExplainGroupPlacementExplainGroupPlacement" = Field(
        alias="explainGroupPlacement"
    )


class ExplainGroupPlacementExplainGroupPlacement(BaseModel):
    placeable: bool
    message: str
    level: Optional[LocalityLevel]
    zone: Optional[str]
    members: list["ExplainGroupPlacementExplainGroupPlacementMembers"]
    kv_paths: list["ExplainGroupPlacementExplainGroupPlacementKvPaths"] = Field(
        alias="kvPaths"
    )
    roles: list["ExplainGroupPlacementExplainGroupPlacementRoles"]


class ExplainGroupPlacementExplainGroupPlacementMembers(BaseModel):
    role: str
    replica_id: str = Field(alias="replicaId")
    node_ids: list[str] = Field(alias="nodeIds")
    fabric: Optional[str]


class ExplainGroupPlacementExplainGroupPlacementKvPaths(BaseModel):
    from_: str = Field(alias="from")
    to: str
    kind: KvPathKind


class ExplainGroupPlacementExplainGroupPlacementRoles(BaseModel):
    role: str
    placeable: bool
    message: str
    verdicts: list["ExplainGroupPlacementExplainGroupPlacementRolesVerdicts"]
    verdicts_omitted: int = Field(alias="verdictsOmitted")


ExplainGroupPlacementExplainGroupPlacementRolesVerdicts = PlacementVerdict
ExplainGroupPlacement.model_rebuild()
ExplainGroupPlacementExplainGroupPlacement.model_rebuild()
ExplainGroupPlacementExplainGroupPlacementRoles.model_rebuild()
