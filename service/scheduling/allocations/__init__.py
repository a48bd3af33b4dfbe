"""Who holds which GPUs: shards of replicas placed on nodes, and recording new ones.

store_statement() is the one write path for holding GPUs: allocate() checks
the GPUs it was given, place() picks free ones, and both hold them through it,
under the same locks, in one round trip that also keeps the pools and writes
the events.

Concurrency, in one paragraph: every writer that changes a node's GPUs,
allocations or state first takes that node's row lock (FOR NO KEY UPDATE: it
conflicts with cordon, removal and re-registration, which update or delete
the row, but not with the foreign-key checks of rows that merely reference
the node). Locks are taken in node-id order, so two allocations spanning the
same nodes queue instead of deadlocking. Under the lock, each check reads
what is committed now (READ COMMITTED takes a fresh snapshot per statement),
and the primary key of allocated_gpus stays the final guard: a claim that
runs into it (a writer that skipped the lock) writes nothing, and reading
again turns it into the rejection that explains it, never a 500.

The package, by idea: records.py (shards as stored and read back),
requests.py (an allocation as asked, checked without the database),
storing.py (store_statement and running it), allocating.py (allocate() and
its checks under the nodes' locks), fabrics.py (the fabric and adapters a
multi-node replica gets), releases.py (releasing shards).
"""

from service.scheduling.allocations.allocating import (
    allocate,
    allocate_on_locked_nodes,
    allocate_or_refuse,
    lock_nodes,
)
from service.scheduling.allocations.records import (
    Allocated,
    ShardRecord,
    list_allocations,
    shard_columns,
    shard_from_row,
    shards_by_id,
    shards_on_nodes,
)
from service.scheduling.allocations.releases import (
    forget_expired_tombstones,
    preempt_replica,
    release_replica,
    release_shard,
)
from service.scheduling.allocations.requests import (
    AllocationRequest,
    ShardRequest,
    validate_request,
)
from service.scheduling.allocations.storing import (
    NotStored,
    Refused,
    ReplicaReleased,
    Rows,
    Stored,
    Tombstoned,
    Wanted,
    WantedMismatch,
    store,
    store_calls,
    store_statement,
)

__all__ = [
    "Allocated",
    "AllocationRequest",
    "NotStored",
    "Refused",
    "ReplicaReleased",
    "Rows",
    "ShardRecord",
    "ShardRequest",
    "Stored",
    "Tombstoned",
    "Wanted",
    "WantedMismatch",
    "allocate",
    "allocate_on_locked_nodes",
    "allocate_or_refuse",
    "forget_expired_tombstones",
    "list_allocations",
    "lock_nodes",
    "preempt_replica",
    "release_replica",
    "release_shard",
    "shard_columns",
    "shard_from_row",
    "shards_by_id",
    "shards_on_nodes",
    "store",
    "store_calls",
    "store_statement",
    "validate_request",
]
