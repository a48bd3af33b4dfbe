"""The llmgw inventory's typed client for schedulers.

    from llmgw_inventory_client import InventoryClient, PlaceInput, Allocated

    async with InventoryClient("http://inventory:8080/graphql", token) as inventory:
        result = await inventory.place(PlaceInput(replica_id="r1", gpu_class="H100-80GB",
                                                  gpus_per_shard=8))
        if isinstance(result, Allocated): ...

docs/scheduler/client.md is the guide. The result classes are generated from
the service's schema (generated/; their shapes are the fragments of
clients/python/operations/fragments.graphql); the names below are the ones a
scheduler handles.
"""

from .client import InventoryClient
from .errors import (
    BadInput,
    Conflict,
    DatabaseUnavailable,
    DeadlineExceeded,
    Forbidden,
    InternalError,
    InvalidRequest,
    InventoryError,
    NodeNotFound,
    PageTruncated,
    Unauthenticated,
    Unavailable,
)
from .generated.base_model import UNSET
from .generated.enums import (
    KvPathKind,
    LocalityLevel,
    NodeState,
    PreemptionPolicy,
    RejectionCode,
    TaintEffect,
    TaintSource,
    TolerationOperator,
    VerdictCode,
    WeightsState,
)
from .generated.fragments import (
    Allocated,
    Allocation,
    AllocationRejected,
    GroupPlaced,
    NodeDetails,
    NodeFreeGpus,
    NodeSummary,
    PlacementVerdict,
    Unplaceable,
)
from .generated.input_types import (
    AllocateInput,
    GroupLocalityInput,
    GroupRoleInput,
    KeyValueInput,
    NodeFilter,
    PlaceGroupInput,
    PlaceInput,
    ShardInput,
    TolerationInput,
)
from .retries import Retry

__all__ = [
    "UNSET",
    "AllocateInput",
    "Allocated",
    "Allocation",
    "AllocationRejected",
    "BadInput",
    "Conflict",
    "DatabaseUnavailable",
    "DeadlineExceeded",
    "Forbidden",
    "GroupLocalityInput",
    "GroupPlaced",
    "GroupRoleInput",
    "InternalError",
    "InvalidRequest",
    "InventoryClient",
    "InventoryError",
    "KeyValueInput",
    "KvPathKind",
    "LocalityLevel",
    "NodeDetails",
    "NodeFilter",
    "NodeFreeGpus",
    "NodeNotFound",
    "NodeState",
    "NodeSummary",
    "PageTruncated",
    "PlaceGroupInput",
    "PlaceInput",
    "PlacementVerdict",
    "PreemptionPolicy",
    "RejectionCode",
    "Retry",
    "ShardInput",
    "TaintEffect",
    "TaintSource",
    "TolerationInput",
    "TolerationOperator",
    "Unauthenticated",
    "Unavailable",
    "Unplaceable",
    "VerdictCode",
    "WeightsState",
]
