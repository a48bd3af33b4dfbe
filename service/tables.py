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
    Sequence,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from service.bounds import id_length_check
from service.node_states import ADMIN_STATE_CHECK, ALIVE, LIVENESS_CHECK, STATE_SQL
from service.scheduling.availability import gpu_usable, pool_offers, pool_reserves, pool_withholds
from service.scheduling.pool_census import census_predicate
from service.scheduling.taints import TaintEffect, TaintSource

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


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
    # Since when (migration 0014a): what the cordon's taint shows as `since`.
    Column("admin_since", DateTime(timezone=True)),
    Column("liveness", Text, nullable=False, server_default=ALIVE),
    Column("liveness_reason", Text),
    # The state schedulers see, derived by the database so that every query
    # and index agrees on it: liveness problems first, then the operator.
    Column(
        "state",
        Text,
        Computed(STATE_SQL, persisted=True),
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
    # Which life of the node this is: one more each time it comes back from
    # LOST and each time it reports a new boot id. An agent sends the one it
    # last saw; a shard placed in an earlier life may no longer run.
    Column("incarnation", Integer, nullable=False, server_default=text("1")),
    Column("registered_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("reported_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_seen", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # When the agent observed each fact block, on the service's clock
    # (service/fleet/observed_at.py): what maxAge compares, since last_seen
    # moves with heartbeats that say nothing about the hardware.
    Column("gpus_observed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column(
        "fabrics_observed_at", DateTime(timezone=True), nullable=False, server_default=func.now()
    ),
    Column(
        "storage_observed_at", DateTime(timezone=True), nullable=False, server_default=func.now()
    ),
    # Why the last report's times were not taken as the agent sent them; NULL: they were.
    Column("observed_at_correction", Text),
    # Whether the agent looked for InfiniBand adapters (reports.HcaDiscovery;
    # migration 0019): NOT_ASKED, its HCAs are unknown, not missing. NULL: an
    # agent that does not say.
    Column("hca_discovery", Text),
    CheckConstraint(id_length_check("id"), name="id_length"),
    CheckConstraint(ADMIN_STATE_CHECK, name="admin_state"),
    CheckConstraint(LIVENESS_CHECK, name="liveness"),
    CheckConstraint("memory_total_mb >= 0", name="memory"),
    CheckConstraint("incarnation >= 1", name="incarnation"),
    CheckConstraint(
        "hca_discovery IN ('LOOKED', 'NO_INFINIBAND', 'NOT_ASKED')", name="hca_discovery"
    ),
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
    Column("cordon_since", DateTime(timezone=True)),
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
    # The driver's recovery action as the agent last read it (NVML's
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: GPU_RESET, NODE_REBOOT...; NULL:
    # unknown; migration 0014c): what XID 154 asks for (fleet/health/policy.py).
    Column("recovery_action", Text),
    # The taints on the GPU and on its node, as two marks (migration 0014a):
    # withheld, a NO_SCHEDULE or NO_EXECUTE taint; last_resort, a
    # PREFER_NO_SCHEDULE one. Derived from the taints table by every write of
    # it and of the node's GPUs (availability.taint_marks), so that a request
    # without tolerations tests a column of the row it reads.
    Column("withheld", Boolean, nullable=False, server_default=text("false")),
    Column("last_resort", Boolean, nullable=False, server_default=text("false")),
    # The live reservation that sets the GPU aside (migration 0024;
    # service/scheduling/reservations/), NULL: none. One column, so a GPU is
    # set aside by at most one live reservation; cleared when it ends. What it
    # means for placement is availability.py's (gpu_admitted).
    Column("reservation", Text),
    # Which of the reservation's replicas the GPU is room for (0..count-1): a
    # failed GPU's whole slot is set aside again, by the shape's rules.
    Column("reservation_slot", Integer),
    PrimaryKeyConstraint("node_id", "idx"),
    CheckConstraint("idx >= 0", name="idx"),
    CheckConstraint("memory_mb >= 0", name="memory"),
    CheckConstraint("numa_node >= 0", name="numa_node"),
    CheckConstraint("nvlink_group >= 0 AND nvlink_group <= idx", name="nvlink_group"),
)
# The GPUs that may take work, by node, with their class (migration 0008):
# a node's free GPUs (Node.freeGpus, availability.gpu_free) are read from it
# index-only, without the wide table rows.
Index(
    "ix_gpus_usable",
    gpus.c.node_id,
    gpus.c.idx,
    postgresql_include=["gpu_class"],
    postgresql_where=text(gpu_usable("")),
)
# A reservation's GPUs (migration 0024): what its transitions and reads find.
Index(
    "ix_gpus_reservation",
    gpus.c.reservation,
    postgresql_where=gpus.c.reservation.isnot(None),
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
    # The free GPUs' indices, ascending (availability.pool_counts): what a
    # page of freeGpus answers per node, kept by the writes that keep `free`.
    Column("free_indices", ARRAY(Integer), nullable=False),
    # The NVLink group of each free GPU, in free_indices' order (NULL: none),
    # and whether any GPU of the class reported NVLink peers: a per-pool
    # summary from which fit with nvlinkShards reads a node's free NVLink
    # groups without reading its GPUs (topology_fit.facts_column).
    Column("free_groups", ARRAY(Integer), nullable=False, server_default=text("'{}'")),
    Column("nvlink_known", Boolean, nullable=False, server_default=text("false")),
    # Usable, unheld GPUs a NO_SCHEDULE or NO_EXECUTE taint keeps from
    # requests that do not tolerate it, and the free ones a
    # PREFER_NO_SCHEDULE taint sends last (availability.pool_counts;
    # migration 0014a).
    Column("withheld", Integer, nullable=False),
    Column("withheld_indices", ARRAY(Integer), nullable=False),
    Column("last_resort", Integer, nullable=False),
    Column("last_resort_indices", ARRAY(Integer), nullable=False),
    Column("schedulable", Boolean, nullable=False),
    # The NVLink domain every GPU of the class on the node reports ('' for
    # none: availability.shared_nvlink_domain), and the node's fabrics by name
    # with their link rates (gpu_pools.attached_fabrics), written by every
    # recount (migration 0018): placement groups and the pool census learn
    # them from the pool, not from a lookup per node.
    Column("nvlink_domain", Text, nullable=False),
    Column("fabrics", ARRAY(Text), nullable=False),
    Column("fabric_rates", ARRAY(Integer), nullable=False),
    # Usable, unheld, untainted GPUs a live reservation sets aside
    # (availability.pool_counts; migration 0024): offered only to the
    # requests the reservation admits (availability.gpu_admitted).
    Column("reserved", Integer, nullable=False, server_default=text("0")),
    Column("reserved_indices", ARRAY(Integer), nullable=False, server_default=text("'{}'")),
    PrimaryKeyConstraint("node_id", "gpu_class"),
    CheckConstraint("free >= 0 AND free <= total", name="free"),
    CheckConstraint("cardinality(free_indices) = free", name="free_indices"),
    CheckConstraint("cardinality(free_groups) = free", name="free_groups"),
    CheckConstraint("cardinality(withheld_indices) = withheld", name="withheld_indices"),
    CheckConstraint(
        "cardinality(last_resort_indices) = last_resort AND last_resort_indices <@ free_indices",
        name="last_resort_indices",
    ),
    CheckConstraint(
        "total = free + allocated + unhealthy + withheld + reserved", name="partition_reserved"
    ),
    CheckConstraint("cardinality(reserved_indices) = reserved", name="reserved_indices"),
    CheckConstraint("cardinality(fabric_rates) = cardinality(fabrics)", name="fabric_rates"),
)
# freeGpus' walk in node order from its cursor (capacity.free_gpus_query):
# `free` and `free_indices` included, so a page is this index alone,
# index-only once vacuum has marked the pages visible (migrations 0008, 0009).
Index(
    "ix_gpu_pools_free",
    gpu_pools.c.gpu_class,
    gpu_pools.c.node_id,
    postgresql_include=["free", "free_indices"],
    postgresql_where=text(pool_offers("")),
)
# place()'s best fit: the nodes of a class with the fewest free GPUs that
# still fit are the first entries of this range, however large the cluster.
# The taint counts are included (migration 0014a), so the window's test of
# whether a node needs its last-resort GPUs stays index-only.
Index(
    "ix_gpu_pools_fit",
    gpu_pools.c.gpu_class,
    gpu_pools.c.free,
    gpu_pools.c.node_id,
    postgresql_include=["withheld", "last_resort"],
    postgresql_where=text(pool_offers("")),
)
# The pool census (service/scheduling/pool_census.py): a class's pools by
# the columns that tell one kind of node from another, then node id, so a
# count by kind walks the kinds and counts index entries (migration 0018).
Index(
    "ix_gpu_pools_census",
    gpu_pools.c.gpu_class,
    gpu_pools.c.schedulable,
    gpu_pools.c.free,
    gpu_pools.c.withheld,
    gpu_pools.c.last_resort,
    gpu_pools.c.nvlink_known,
    gpu_pools.c.free_groups,
    gpu_pools.c.fabrics,
    gpu_pools.c.fabric_rates,
    gpu_pools.c.nvlink_domain,
    gpu_pools.c.node_id,
    postgresql_where=text(census_predicate("")),
)
# The pools with GPUs only a PREFER_NO_SCHEDULE taint's GPUs make fit, in
# best-fit order: place's window reads them after the others (migration
# 0014a); empty on a cluster without such taints.
Index(
    "ix_gpu_pools_last_resort",
    gpu_pools.c.gpu_class,
    gpu_pools.c.free,
    gpu_pools.c.node_id,
    postgresql_where=text(f"{pool_offers('')} AND last_resort > 0"),
)
# The pools where a toleration can add GPUs: what a request with
# tolerations reads besides the pools that offer GPUs anyway
# (availability.pool_withholds; migration 0014a), in node order: of any
# class for a page of freeGpus, of one class for freeGpus and place's window.
Index(
    "ix_gpu_pools_withheld",
    gpu_pools.c.node_id,
    gpu_pools.c.gpu_class,
    postgresql_where=text(pool_withholds("")),
)
Index(
    "ix_gpu_pools_withheld_class",
    gpu_pools.c.gpu_class,
    gpu_pools.c.node_id,
    postgresql_where=text(pool_withholds("")),
)
# The pools with GPUs set aside (migration 0024): what a place with `until`
# reads besides the pools that offer GPUs anyway (availability.pool_reserves).
Index(
    "ix_gpu_pools_reserved",
    gpu_pools.c.gpu_class,
    gpu_pools.c.node_id,
    postgresql_where=text(pool_reserves("")),
)

# Taints (service/scheduling/taints.py) on a GPU (gpu_index) or on a whole
# node (gpu_index NULL), one per key on each. Kept apart from the gpus rows
# (migration 0014a): a GPU that drops out of a report (fallen off the bus)
# and comes back after a reboot must come back tainted, and a report
# rewrites its node's GPU rows. gpus.withheld and gpus.last_resort are
# derived from these rows (availability.taint_marks).
taints = Table(
    "taints",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_index", Integer),
    Column("key", Text, nullable=False),
    Column("value", Text),
    Column("effect", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("actor", Text),
    Column("since", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("node_id", "gpu_index", "key", postgresql_nulls_not_distinct=True),
    CheckConstraint(id_length_check("key"), name="key_length"),
    CheckConstraint("gpu_index >= 0", name="gpu_index"),
    CheckConstraint(
        "effect IN (" + ", ".join(f"'{e.value}'" for e in TaintEffect) + ")", name="effect"
    ),
    CheckConstraint(
        "source IN (" + ", ".join(f"'{s.value}'" for s in TaintSource) + ")", name="source"
    ),
)

# The nodes a NO_EXECUTE taint is on: where shardsToMove looks (service/fleet/health/moves.py).
# Without it that read is a pass over every taint, which grows with the fleet's
# XID and operator taints (one node in 29 with an XID taint took it past a page's cost).
Index(
    "ix_taints_no_execute",
    taints.c.node_id,
    postgresql_where=text(f"effect = '{TaintEffect.NO_EXECUTE.value}'"),
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
    CheckConstraint(id_length_check("fabric"), name="fabric_length"),
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
    # What the agent saw (service/scheduling/weights_lifecycle.py); NULL state:
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

# Every fence and every replica generation comes from this one sequence, so
# each is larger than any issued before it, whatever the GPU or replica: an
# engine started with a fence is told to stop once its GPU holds a later one.
# An integer (GraphQL's Int is 32-bit), far beyond any cluster's placements.
shard_fence = Sequence("shard_fence", metadata=metadata, data_type=Integer)

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
    # The fencing token its engine is started with (service/fleet/fencing.py).
    Column(
        "fence",
        Integer,
        nullable=False,
        unique=True,
        server_default=text("nextval('shard_fence'::regclass)"),
    ),
    # Set when the replica changed after this shard was stored (a shard of it
    # released); the replica's generation is the largest of its shards'
    # coalesce(generation, fence) (service/scheduling/generations.py).
    Column("generation", Integer),
    # Since when this shard is held for a LOST node (INVENTORY_LOST_POLICY=hold):
    # its GPUs stay allocated, nothing is placed on them, until the node
    # returns and confirms it or an operator frees it.
    Column("held_since", DateTime(timezone=True)),
    # The weights path the replica was placed with: the shard pins those
    # weights on its node while it lives (service/scheduling/weights_lifecycle.pinned_by).
    Column("weights", Text),
    # The taints the replica tolerates, as place or allocate was asked
    # (taints.tolerations_json; NULL: none; migration 0014b): what says when
    # a NO_EXECUTE taint on its GPUs tells its engine to stop (taints.stop_by_sql).
    Column("tolerations", JSONB),
    # Who the replica is charged to, how important it is, the deployment whose
    # disruption budget covers it, and whether the claim took its tenant past
    # its guarantee (migration 0022; service/scheduling/tenancy/).
    # Bounded by the requests' checks (tenancy/charges.charge_problem), which
    # every claim passes: a CHECK added by migration 0022 would have scanned
    # shards under an ACCESS EXCLUSIVE lock (docs/deployment/upgrades.md).
    Column("tenant", Text, nullable=False, server_default=text("'default'")),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("deployment", Text),
    Column("borrowed", Boolean, nullable=False, server_default=text("true")),
    # The replica's promise to be gone by then (PlaceInput.until; migrations
    # 0025 and 0024), and the reservation it was placed into (0024): it may use
    # GPUs set aside for a later window and nodes whose maintenance starts
    # later; still placed on reserved GPUs at its reservation's start, it is
    # told to stop (service/scheduling/reservations/). NULL: no promise.
    Column("until", DateTime(timezone=True)),
    Column("reservation", Text),
    # True when the replica has another shard on the same node (together
    # they may make room where none alone does: placement/preemption.py's
    # _SINGLES reads them apart). Kept by the trigger shards_crowded on
    # insert (migration 0026p), never cleared while the shard lives.
    Column("crowded", Boolean),
    CheckConstraint(id_length_check("shard_id"), name="shard_id_length"),
    CheckConstraint(id_length_check("replica_id"), name="replica_id_length"),
    CheckConstraint("cardinality(gpu_indices) > 0", name="gpu_indices"),
)
Index("ix_shards_replica_id", shards.c.replica_id)
Index("ix_shards_node_id", shards.c.node_id)
Index(
    "ix_shards_reservation",
    shards.c.reservation,
    postgresql_where=shards.c.reservation.isnot(None),
)
Index("ix_shards_until", shards.c.until, postgresql_where=shards.c.until.isnot(None))
# Shards in the order preemption tries sets of one victim (victims.set_key:
# priority, GPUs, the youngest, the id as Python compares it): the window of
# placement/preemption.py's _SINGLES walks it (migration 0026p).
Index(
    "ix_shards_victim_order",
    shards.c.priority,
    func.cardinality(shards.c.gpu_indices),
    shards.c.created_at.desc(),
    shards.c.replica_id.collate("C"),
)
Index("ix_shards_crowded", shards.c.replica_id, postgresql_where=shards.c.crowded)
# A deployment's replicas, per tenant: what a disruption budget counts as placed.
Index(
    "ix_shards_deployment",
    shards.c.deployment,
    shards.c.tenant,
    postgresql_where=shards.c.deployment.isnot(None),
)

# One row per replica id that a claim stored shards for or that was released
# while holding nothing: the row a claim and a release of the same id
# serialize on, so that a release sees the shards of a claim committing at
# that moment, or the claim sees the release's tombstone and is refused
# (service/scheduling/allocations/storing.py; migration 0017). A row without
# a tombstone says nothing by itself.
replicas = Table(
    "replicas",
    metadata,
    Column("replica_id", Text, primary_key=True),
    # Released while it held nothing (its scheduler gave up on placing it):
    # a claim of this id is refused until tombstone_until.
    Column("released_at", DateTime(timezone=True)),
    Column("tombstone_until", DateTime(timezone=True)),
    Column("released_by", Text),
    CheckConstraint(id_length_check("replica_id"), name="replica_id_length"),
    CheckConstraint("(released_at IS NULL) = (tombstone_until IS NULL)", name="tombstone"),
)
Index(
    "ix_replicas_tombstone_until",
    replicas.c.tombstone_until,
    postgresql_where=replicas.c.tombstone_until.isnot(None),
)

# One row per held GPU. Its primary key is the final guard against double
# booking: whatever a scheduler read, two transactions cannot both insert the
# same (node, index), even from different service processes.
allocated_gpus = Table(
    "allocated_gpus",
    metadata,
    Column("node_id", Text, nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("shard_id", Text, nullable=False),
    # Its shard's tenant and the GPU's class when it was claimed (migration
    # 0022): what the quota counters' triggers count, without a join. Every
    # claim writes the class; NULL only from 0021's code during a roll,
    # counted against no quota.
    Column("tenant", Text, nullable=False, server_default=text("'default'")),
    Column("gpu_class", Text),
    PrimaryKeyConstraint("node_id", "gpu_index"),
    ForeignKeyConstraint(["shard_id"], ["shards.shard_id"], ondelete="CASCADE"),
    ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="CASCADE"),
)
Index("ix_allocated_gpus_shard_id", allocated_gpus.c.shard_id)
# What a tenant holds of a class without a quota row (no counter): counted
# from this index when asked (service/scheduling/tenancy/tenants.py).
Index("ix_allocated_gpus_tenant", allocated_gpus.c.tenant, allocated_gpus.c.gpu_class)

# Placement groups (issue 39): roles of replicas placed as one unit. The
# spec is the group as asked (roles, shapes, locality, KV roles), so a retry
# with the same spec is answered from what is stored and another is refused;
# generation moves up with every scaleGroup, and a change naming an older one
# is refused. The members are ordinary replicas (their shards are in
# `shards`, under the replica id <groupId>-<role>-<n>); a member released by
# releaseReplica keeps its row and holds nothing.
placement_groups = Table(
    "placement_groups",
    metadata,
    Column("group_id", Text, primary_key=True),
    Column("spec", JSONB, nullable=False),
    Column("generation", Integer, nullable=False, server_default=text("1")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

group_members = Table(
    "group_members",
    metadata,
    Column("replica_id", Text, primary_key=True),
    Column(
        "group_id",
        Text,
        ForeignKey("placement_groups.group_id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("role", Text, nullable=False),
    Column("n", Integer, nullable=False),
    UniqueConstraint("group_id", "role", "n"),
)

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
    # The tenant a scheduler token places as (migration 0022); NULL: unbound.
    Column("tenant", Text),
    CheckConstraint("(role = 'agent') = (node_id IS NOT NULL)", name="agent_node"),
    CheckConstraint("tenant IS NULL OR role = 'scheduler'", name="scheduler_tenant"),
)
