from .base_model import BaseModel
from .fragments import NodeDetails


class Nodes(BaseModel):
    nodes: list["NodesNodes"]


NodesNodes = NodeDetails
Nodes.model_rebuild()
