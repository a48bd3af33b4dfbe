from datetime import datetime
from typing import Optional

from pydantic import Field

from .base_model import BaseModel
from .enums import TaintEffect, TaintSource
from .fragments import Allocation


class ShardsToMove(BaseModel):
    shards_to_move: list["ShardsToMoveShardsToMove"] = Field(alias="shardsToMove")


class ShardsToMoveShardsToMove(BaseModel):
    shard_id: str = Field(alias="shardId")
    allocation: "ShardsToMoveShardsToMoveAllocation"
    stop_by: datetime = Field(alias="stopBy")
    overdue: bool
    taint: "ShardsToMoveShardsToMoveTaint"


ShardsToMoveShardsToMoveAllocation = Allocation


class ShardsToMoveShardsToMoveTaint(BaseModel):
    key: str
    value: Optional[str]
    effect: TaintEffect
    source: TaintSource
    reason: str
    since: datetime


ShardsToMove.model_rebuild()
ShardsToMoveShardsToMove.model_rebuild()
