"""The inventory's schema: what PostgreSQL keeps and the constraints that make bad states impossible.

Alembic's first revision creates exactly these tables; a test checks that the
migrated database and this module agree.
"""

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Computed,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from service.scheduling.availability import gpu_usable, pool_offers

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# Ids are DNS-name sized: agents default to a hostname or machine-id, and an
# unbounded id would let one report bloat every index it lands in.
ID_CHECK = "char_length({col}) BETWEEN 1 AND 253"

nodes = Table(
    "nodes",
    metadata,
    Column("id", Text, primary_key=True),
    Column("hostname", Text, nullable=False),
    Column("mgmt_addr", Text, nullable=False),
    Column("labels", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # NULL is "the agent did not say", which constrains nothing; 0 would read
    # as a machine with no memory.
    Column("memory_total_mb", Integer),
    Column("agent_version", Text),
    Column("engine_versions", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # An operator's intent and the node's liveness are kept apart: a cordoned
    # node that drops off the network and comes back must still be cordoned,
    # with the operator's reason, which one merged column cannot remember.
    Column("admin_state", Text),
    Column("admin_reason", Text),
    Column("admin_actor", Text),
    Column("liveness", Text, nullable=False, server_default="alive"),
    Column("liveness_reason", Text),
    # The state schedulers see, derived by the database so that every query
    # and index agrees on it: liveness problems first, then the operator.
    Column(
        "state",
        Text,
        Computed(
            "CASE WHEN liveness <> 'alive' THEN liveness "
            "WHEN admin_state IS NOT NULL THEN admin_state ELSE 'ready' END",
            persisted=True,
        ),
        nullable=False,
    ),
    # Sums over the node's filesystems, kept with the node so the disk filter
    # is a column comparison. NULL when no non-shared filesystem was reported:
    # unknown, never zero.
    Column("local_disk_free", BigInteger),
    Column("local_disk_total", BigInteger),
    Column("shared_disk_free", BigInteger),
    Column("shared_disk_total", BigInteger),
    # False when the agent reported no weights: it was not asked to look, so
    # a weights filter must not exclude it.
    Column("knows_its_weights", Boolean, nullable=False, server_default=text("false")),
    # A digest of the last full report. An unchanged report only touches
    # last_seen: rewriting identical GPU rows leaves dead tuples that double
    # scheduler query times until vacuum catches up.
    Column("report_digest", Text),
    # The kernel's boot id the agent last reported: a new one means the node
    # rebooted and its GPUs were reset (clears sticky reasons).
    Column("boot_id", Text),
    Column("registered_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("reported_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_seen", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(ID_CHECK.format(col="id"), name="id_length"),
    CheckConstraint("admin_state IN ('cordoned', 'draining')", name="admin_state"),
    CheckConstraint("liveness IN ('alive', 'unreachable', 'lost')", name="liveness"),
    CheckConstraint("memory_total_mb >= 0", name="memory"),
    CheckConstraint(
        "local_disk_free BETWEEN 0 AND local_disk_total "
        "AND shared_disk_free BETWEEN 0 AND shared_disk_total",
        name="disk",
    ),
)
Index("ix_nodes_state_id", nodes.c.state, nodes.c.id)
Index("ix_nodes_labels", nodes.c.labels, postgresql_using="gin")
# No index on last_seen, and fillfactor 70 (migration 0003): every heartbeat
# moves last_seen, and an indexed column or a full page turns each of those
# updates into new entries in every index of the table.

gpus = Table(
    "gpus",
    metadata,
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("idx", Integer, nullable=False),
    Column("uuid", Text),
    # Where the card sits on the bus: what an operator pulls when an RMA
    # names a GPU, since indices can change with the driver's enumeration.
    Column("pci_bus_id", Text),
    Column("name", Text, nullable=False),
    Column("gpu_class", Text, nullable=False),
    Column("memory_mb", Integer),
    Column("healthy", Boolean, nullable=False),
    Column("health_reasons", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    # The service's own memory of the GPU, which no report overwrites
    # (migration 0005): an operator's cordon, and the reasons a reset must
    # clear (a critical XID: service/fleet/gpu_health.py). What they mean for
    # placement is service/scheduling/availability.py's.
    Column("cordon_reason", Text),
    Column("cordon_actor", Text),
    Column("sticky_reasons", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    # Topology (migration 0006), NULL when the agent did not say: unknown is
    # not "none", and only a request that needs the fact is refused for it.
    Column("numa_node", Integer),
    # GPUs of this node reached over NVLink, directly or through NVSwitch.
    Column("nvlink_peers", ARRAY(Integer)),
    # The lowest index of the GPU's NVLink-connected set, derived from the
    # peers when the report is stored (service.fleet.topology.nvlink_groups).
    Column("nvlink_group", Integer),
    Column("nvlink_domain", Text),
    # Adapters under the same PCIe switch: the GPU's rail-aligned HCAs.
    Column("near_hcas", ARRAY(Text)),
    PrimaryKeyConstraint("node_id", "idx"),
    CheckConstraint("idx >= 0", name="idx"),
    CheckConstraint("memory_mb >= 0", name="memory"),
    CheckConstraint("numa_node >= 0", name="numa_node"),
    CheckConstraint("nvlink_group >= 0 AND nvlink_group <= idx", name="nvlink_group"),
)
# The GPUs that may take work, by node, with their class (migration 0008):
# freeGpus reads a page's free GPUs from it index-only, a thousand nodes'
# worth in one scan (capacity.free_gpus_query), without the wide table rows.
Index(
    "ix_gpus_usable",
    gpus.c.node_id,
    gpus.c.idx,
    postgresql_include=["gpu_class"],
    postgresql_where=text(gpu_usable("")),
)

# One row per (node, GPU class): how many of them exist, are unhealthy, are
# held, and are free, plus whether the node accepts placement. Kept current by
# every transaction that changes any of those, so "free H100s on ready nodes"
# is an index range scan whose cost grows with the answer, not with the cluster
# (an aggregate over every GPU anti-joined with allocations does not).
gpu_pools = Table(
    "gpu_pools",
    metadata,
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_class", Text, nullable=False),
    Column("total", Integer, nullable=False),
    Column("unhealthy", Integer, nullable=False),
    Column("allocated", Integer, nullable=False),
    Column("free", Integer, nullable=False),
    Column("schedulable", Boolean, nullable=False),
    PrimaryKeyConstraint("node_id", "gpu_class"),
    CheckConstraint("free >= 0 AND free <= total", name="free"),
)
# freeGpus' walk in node order from its cursor (capacity.free_gpus_query):
# `free` included, so testing minFree needs no table row (migration 0008).
Index(
    "ix_gpu_pools_free",
    gpu_pools.c.gpu_class,
    gpu_pools.c.node_id,
    postgresql_include=["free"],
    postgresql_where=text(pool_offers("")),
)
# place()'s best fit: the nodes of a class with the fewest free GPUs that
# still fit are the first entries of this range, however large the cluster.
Index(
    "ix_gpu_pools_fit",
    gpu_pools.c.gpu_class,
    gpu_pools.c.free,
    gpu_pools.c.node_id,
    postgresql_where=text(pool_offers("")),
)

fabric_attachments = Table(
    "fabric_attachments",
    metadata,
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("fabric", Text, nullable=False),
    Column("hcas", ARRAY(Text), nullable=False),
    Column("rate_gbps", Integer, nullable=False),
    PrimaryKeyConstraint("node_id", "fabric"),
    CheckConstraint("rate_gbps >= 0", name="rate"),
    CheckConstraint(ID_CHECK.format(col="fabric"), name="fabric_length"),
)
Index("ix_fabric_attachments_fabric", fabric_attachments.c.fabric, fabric_attachments.c.node_id)

filesystems = Table(
    "filesystems",
    metadata,
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("fs_id", Text, nullable=False),
    Column("mount_point", Text, nullable=False),
    Column("fs_type", Text),
    Column("shared", Boolean, nullable=False),
    Column("free_bytes", BigInteger, nullable=False),
    Column("total_bytes", BigInteger, nullable=False),
    Column("directories", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    PrimaryKeyConstraint("node_id", "fs_id"),
    CheckConstraint("free_bytes BETWEEN 0 AND total_bytes", name="bytes"),
)

weights = Table(
    "weights",
    metadata,
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("path", Text, nullable=False),
    Column("size_bytes", BigInteger),
    # What the agent saw (service/fleet/weights_lifecycle.py); NULL state:
    # the agent did not say (present, state unknown).
    Column("revision", Text),
    Column("state", Text),
    Column("total_bytes", BigInteger),
    Column("digest", Text),
    Column("observed_at", DateTime(timezone=True)),
    PrimaryKeyConstraint("node_id", "path"),
    CheckConstraint("size_bytes >= 0", name="size"),
    CheckConstraint("state IN ('downloading', 'ready', 'evicting', 'failed')", name="state"),
    CheckConstraint(
        "total_bytes >= 0 AND (size_bytes IS NULL OR size_bytes <= total_bytes)", name="total"
    ),
)
Index("ix_weights_path", weights.c.path, weights.c.node_id)

# A shard of a replica placed on one node. Removing the node removes its
# shards: an allocation on a node that no longer exists would hold nothing.
shards = Table(
    "shards",
    metadata,
    Column("shard_id", Text, primary_key=True),
    Column("replica_id", Text, nullable=False),
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_indices", ARRAY(Integer), nullable=False),
    # The fabric a multi-node replica was placed on and this shard's adapters
    # on it: a shard handed an adapter of another fabric can pick a peer it
    # cannot reach and hang instead of failing.
    Column("fabric", Text),
    Column("hcas", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The weights path the replica was placed with: the shard pins those
    # weights on its node while it lives (service/fleet/weights_lifecycle.pinned_by).
    Column("weights", Text),
    CheckConstraint(ID_CHECK.format(col="shard_id"), name="shard_id_length"),
    CheckConstraint(ID_CHECK.format(col="replica_id"), name="replica_id_length"),
    CheckConstraint("cardinality(gpu_indices) > 0", name="gpu_indices"),
)
Index("ix_shards_replica_id", shards.c.replica_id)
Index("ix_shards_node_id", shards.c.node_id)

# One row per held GPU. Its primary key is the final guard against double
# booking: whatever a scheduler read, two transactions cannot both insert the
# same (node, index), even from different service processes.
allocated_gpus = Table(
    "allocated_gpus",
    metadata,
    Column("node_id", Text, nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("shard_id", Text, nullable=False),
    PrimaryKeyConstraint("node_id", "gpu_index"),
    ForeignKeyConstraint(["shard_id"], ["shards.shard_id"], ondelete="CASCADE"),
    ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="CASCADE"),
)
Index("ix_allocated_gpus_shard_id", allocated_gpus.c.shard_id)

# What happened, in order: state changes, allocations and releases. The id
# orders events across service processes; `at` is the database's clock.
events = Table(
    "events",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("kind", Text, nullable=False),
    Column("node_id", Text),
    Column("replica_id", Text),
    Column("shard_id", Text),
    Column("actor", Text),
    Column("reason", Text),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
)
Index("ix_events_node_id", events.c.node_id, events.c.id)
Index("ix_events_replica_id", events.c.replica_id, events.c.id)
Index("ix_events_at", events.c.at)

# Bearer tokens, stored as a digest only: a leaked database backup must not
# hand out working credentials.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", Text, primary_key=True),
    Column("digest", Text, nullable=False, unique=True),
    Column("role", Text, nullable=False),
    Column("node_id", Text),
    Column("description", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("revoked_at", DateTime(timezone=True)),
    # NULL: never expires. Judged by the database's clock (service/access_control/tokens.py).
    Column("expires_at", DateTime(timezone=True)),
    CheckConstraint("role IN ('reader', 'agent', 'scheduler', 'operator')", name="role"),
    CheckConstraint("(role = 'agent') = (node_id IS NOT NULL)", name="agent_node"),
)
