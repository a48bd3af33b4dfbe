from .base_model import BaseModel
from .fragments import NodeDetails


class NodesCompiled(BaseModel):
    nodes: list["NodesCompiledNodes"]


NodesCompiledNodes = NodeDetails
NodesCompiled.model_rebuild()
