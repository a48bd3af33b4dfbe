"""Bounds on what the service accepts: the one home of every size limit of a report or request.

Bounds that no real node or replica comes near; they keep one broken or
hostile agent or scheduler from writing a report or a request that bloats
every scheduler query or makes a statement of unbounded size. Every list a
GraphQL request passes in is bounded by one of them before its values are
coerced (service/graphql/list_bounds.py names which). The checks in
Python (service/fleet/reports.py, service/scheduling/allocations/requests.py,
service/scheduling/placement/plan.py, service/access_control/tokens.py) and
the database's CHECKs (service/tables.py, id_length_check) read them here,
so a bound cannot be raised in one and kept in the other. This module
imports nothing from the service: every layer may read it.
"""

from __future__ import annotations

# Ids are DNS-name sized: agents default to a hostname or machine-id, and an
# unbounded id would let one report bloat every index it lands in.
MAX_ID_LENGTH = 253
MAX_TEXT_LENGTH = 1024
MAX_PATH_LENGTH = 4096
MAX_GPUS = 64
MAX_LABELS = 64
MAX_FABRICS = 16
MAX_HCAS = 64
MAX_FILESYSTEMS = 64
MAX_DIRECTORIES = 256
MAX_WEIGHTS = 10_000
# Running shards an agent reports in one heartbeat (service/fleet/fencing.py):
# a node runs at most a shard per GPU, stale engines may add a few; far above
# that, low enough that one request cannot make a statement of unbounded size.
MAX_RUNNING_SHARDS = 256
MAX_ENGINE_VERSIONS = 32
MAX_HEALTH_REASONS = 16
MAX_XIDS = 64  # per GPU per report: an XID storm still says enough in 64
MAX_RATE_GBPS = 100_000
MAX_MEMORY_MB = 1 << 30  # a PiB of RAM
MAX_BYTES = (1 << 63) - 1  # what PostgreSQL's bigint holds
# An NVLink domain name is bounded as an id is.
MAX_DOMAIN_LENGTH = MAX_ID_LENGTH
MAX_NUMA_NODE = 1 << 16

# Tolerations one request may carry, and the longest a NO_EXECUTE taint may be
# tolerated (a year: beyond any grace a scheduler asks for, and now() + it
# stays a timestamp): service/scheduling/taints.py.
MAX_TOLERATIONS = 32
MAX_TOLERATION_SECONDS = 86_400 * 365
# A validation's output kept with its result (service/fleet/health/validations.py):
# enough to read why it failed; an agent sends the end of a longer one.
MAX_VALIDATION_DETAILS = 16_384
# Nodes a `fit` may count as gone (excludeNodes): a drain plan of the whole
# fleet the benchmarks model (10,000 nodes) still fits.
MAX_EXCLUDED_NODES = 10_000
# Kinds one events filter names: above the kinds the service writes
# (service/event_log/events.py EVENT_KINDS), each named once.
MAX_EVENT_KINDS = 64

# A replica is at most this many shards: far above any real tensor/pipeline
# split, low enough that one request cannot make a statement of unbounded size.
MAX_SHARDS = 64
# The longest a client may say it waits for an answer (X-Client-Timeout,
# seconds): past an hour no scheduler is still waiting, and a value that
# large is a unit mistake (milliseconds sent as seconds).
MAX_CLIENT_TIMEOUT = 3600.0
MAX_GPUS_PER_SHARD = MAX_GPUS
# Replicas in one placement group, all roles together, and roles in one group.
MAX_GROUP_REPLICAS = 256
MAX_GROUP_ROLES = 16

# Tenancy (service/scheduling/tenancy/): a replica's priority (the contract's
# range, inclusive), the GPU classes one tenant has quotas for, the GPUs a
# quota counts (far above any fleet, low enough that sums stay integers), and
# a disruption budget's minAvailable.
MIN_PRIORITY = -1_000_000
MAX_PRIORITY = 1_000_000
MAX_TENANT_QUOTAS = 64
MAX_QUOTA_GPUS = 10_000_000
MAX_MIN_AVAILABLE = 1_000_000

# Maintenance windows (service/fleet/maintenance/, docs/operations/maintenance.md):
# the nodes one window lists (a few racks), the longest window (two weeks: a
# longer one is a decommission, which removeNode says), the longest drain
# lead (a week), and how far in the past a window may start (an operator's
# clock or a retried request a few minutes late; an older start is a typo).
MAX_MAINTENANCE_NODES = 1024
MAX_MAINTENANCE_SECONDS = 14 * 86_400
MAX_DRAIN_LEAD_SECONDS = 7 * 86_400
MAX_MAINTENANCE_START_PAST_SECONDS = 3600


# Reservations (issue 47; docs/scheduler/reservations.md). A reservation's
# start may lie at most this far in the past (a reserve sent a moment late,
# or retried, still counts; one an hour late is a mistake); its window at
# most this long (an open end, until released, is allowed); at most this
# many replicas.
MAX_RESERVATION_START_PAST = 300
MAX_RESERVATION_WINDOW = 90 * 86_400
MAX_RESERVATION_REPLICAS = 256


def id_length_check(column: str) -> str:
    """SQL CHECK: the id in `column` is 1 to MAX_ID_LENGTH characters (tables.py's id columns)."""
    return f"char_length({column}) BETWEEN 1 AND {MAX_ID_LENGTH}"
