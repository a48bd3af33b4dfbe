from .base_model import BaseModel
from .fragments import Allocation


class Allocations(BaseModel):
    allocations: list["AllocationsAllocations"]


AllocationsAllocations = Allocation
Allocations.model_rebuild()
