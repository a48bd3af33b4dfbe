from datetime import datetime
from typing import Any, Optional

from pydantic import Field

from .base_model import BaseModel


class Events(BaseModel):
    events: "EventsEvents"


class EventsEvents(BaseModel):
    id: str
    at: datetime
    kind: str
    node_id: Optional[str] = Field(alias="nodeId")
    replica_id: Optional[str] = Field(alias="replicaId")
    shard_id: Optional[str] = Field(alias="shardId")
    actor: Optional[str]
    reason: Optional[str]
    detail: Any


Events.model_rebuild()
