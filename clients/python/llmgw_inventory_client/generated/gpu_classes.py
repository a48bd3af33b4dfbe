from pydantic import Field

from .base_model import BaseModel


class GpuClasses(BaseModel):
    gpu_classes: list["GpuClassesGpuClasses"] = Field(alias="gpuClasses")


class GpuClassesGpuClasses(BaseModel):
    gpu_class: str = Field(alias="gpuClass")
    total: int
    free: int
    allocated: int
    unhealthy: int
    unschedulable: int
    tainted: int


GpuClasses.model_rebuild()
