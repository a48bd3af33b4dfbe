from pydantic import Field

from .base_model import BaseModel


class ReleaseGroup(BaseModel):
    release_group: int = Field(alias="releaseGroup")
