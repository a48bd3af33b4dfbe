from pydantic import Field

from .base_model import BaseModel


class ReleaseReplica(BaseModel):
    release_replica: int = Field(alias="releaseReplica")
