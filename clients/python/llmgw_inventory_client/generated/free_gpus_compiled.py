from pydantic import Field

from .base_model import BaseModel
from .fragments import NodeFreeGpus


class FreeGpusCompiled(BaseModel):
    free_gpus: list["FreeGpusCompiledFreeGpus"] = Field(alias="freeGpus")


FreeGpusCompiledFreeGpus = NodeFreeGpus
FreeGpusCompiled.model_rebuild()
