from typing import Optional

from .base_model import BaseModel
from .fragments import GroupPlaced


class Group(BaseModel):
    group: Optional["GroupGroup"]


GroupGroup = GroupPlaced
Group.model_rebuild()
