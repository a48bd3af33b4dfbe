from pydantic import Field

from .base_model import BaseModel
from .fragments import NodeFreeGpus


class FreeGpus(BaseModel):
    free_gpus: list["FreeGpusFreeGpus"] = Field(alias="freeGpus")


FreeGpusFreeGpus = NodeFreeGpus
FreeGpus.model_rebuild()
