from typing import Optional

from .base_model import BaseModel
from .fragments import NodeDetails


class Node(BaseModel):
    node: Optional["NodeNode"]


NodeNode = NodeDetails
Node.model_rebuild()
