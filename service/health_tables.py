"""Fleet health's tables (issue 38): remediations, validation results, hardware profiles, drift.

Part of the schema: every table here is on service/tables.py's metadata,
apart only to keep each module one idea (and under its size). Whoever reads
the whole schema from the metadata imports this module too: alembic/env.py,
tests/operations/test_migrations.py (which fails if the metadata and the
migrations differ). What the rows mean is service/fleet/health/'s.
"""

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY

from service.bounds import id_length_check
from service.tables import metadata

# Remediations (service/fleet/health/remediations.py; migration 0014c): work
# for the operator's automation, one per fault the policy acts on, with its
# state machine PENDING -> IN_PROGRESS -> AWAITING_VALIDATION -> DONE (or
# ESCALATED, or SUPPRESSED by the circuit breaker). The taint it put on its
# GPUs (or node: scope) is lifted when it is DONE.
remediations = Table(
    "remediations",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_indices", ARRAY(Integer), nullable=False),
    Column("gpu_class", Text),
    Column("action", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("scope", Text, nullable=False),
    # What set it off, as a person reads it ("xid 79: the GPU has fallen off
    # the bus"), and as a key: the same trigger on the same GPUs while one is
    # open makes no second one.
    Column("cause", Text, nullable=False),
    Column("trigger", Text, nullable=False),
    # The taint it holds (key; on gpu_indices, or the node for scope NODE), or
    # NULL when the rule taints nothing or the breaker suppressed it.
    Column("taint_key", Text),
    # Validations recorded against it, and how many failed.
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("failures", Integer, nullable=False, server_default=text("0")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Since when it is in its state.
    Column("since", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(
        "action IN ('NONE', 'RESTART_APP', 'RESET_GPU', 'REBOOT_NODE', 'CONTACT_SUPPORT')",
        name="action",
    ),
    CheckConstraint(
        "state IN ('PENDING', 'IN_PROGRESS', 'AWAITING_VALIDATION', 'DONE', 'ESCALATED',"
        " 'SUPPRESSED')",
        name="state",
    ),
    CheckConstraint("scope IN ('GPU', 'NVLINK_GROUP', 'NODE')", name="scope"),
    CheckConstraint("cardinality(gpu_indices) > 0", name="gpu_indices"),
    CheckConstraint("attempts >= 0 AND failures BETWEEN 0 AND attempts", name="attempts"),
)
Index("ix_remediations_node_id", remediations.c.node_id, remediations.c.id)
Index("ix_remediations_state", remediations.c.state, remediations.c.id)

# Each fault a remediation acted on (service/fleet/health/faults.py; migration
# 0021): the one that opened it and each that joined it, on which of its GPUs,
# with the taint it put there (NULL: its rule taints nothing, or the breaker
# kept it off) and when. A remediation's DONE lifts these taints and clears
# these faults' sticky health; the circuit breaker counts the GPUs they
# tainted in the last hour. A fault seen again on the same GPUs of the same
# remediation refreshes its row.
remediation_faults = Table(
    "remediation_faults",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column(
        "remediation_id",
        BigInteger,
        ForeignKey("remediations.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("gpu_class", Text),
    Column("gpu_indices", ARRAY(Integer), nullable=False),
    # GPU, NVLINK_GROUP or NODE: a NODE fault's taint is on the node.
    Column("scope", Text, nullable=False),
    Column("trigger", Text, nullable=False),
    # The fault's own action; the remediation's is the most drastic of them.
    Column("action", Text, nullable=False),
    Column("cause", Text, nullable=False),
    Column("taint_key", Text),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(
        "action IN ('NONE', 'RESTART_APP', 'RESET_GPU', 'REBOOT_NODE', 'CONTACT_SUPPORT')",
        name="action",
    ),
    CheckConstraint("scope IN ('GPU', 'NVLINK_GROUP', 'NODE')", name="scope"),
    CheckConstraint("cardinality(gpu_indices) > 0", name="gpu_indices"),
)
Index(
    "ix_remediation_faults_remediation_id",
    remediation_faults.c.remediation_id,
    remediation_faults.c.id,
)
# The circuit breaker counts a class's taints of the last hour.
Index("ix_remediation_faults_class", remediation_faults.c.gpu_class, remediation_faults.c.at)

# Validation results (service/fleet/health/validations.py): what the agent
# (or an operator's tool) ran on which GPUs, and whether it passed; a
# remediation awaiting validation is DONE once every test the policy
# requires has passed since it began waiting.
validation_results = Table(
    "validation_results",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("remediation_id", BigInteger, ForeignKey("remediations.id", ondelete="SET NULL")),
    Column("gpu_indices", ARRAY(Integer), nullable=False),
    Column("test", Text, nullable=False),
    Column("passed", Boolean, nullable=False),
    Column("details", Text),
    Column("actor", Text),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(id_length_check("test"), name="test_length"),
)
Index("ix_validation_results_remediation_id", validation_results.c.remediation_id)

# Hardware profiles (service/fleet/health/drift.py; migration 0014d): what
# the nodes a label selects should have. NULL: the profile does not say.
hardware_profiles = Table(
    "hardware_profiles",
    metadata,
    Column("name", Text, primary_key=True),
    Column("selector_key", Text, nullable=False),
    Column("selector_value", Text, nullable=False),
    Column("gpu_count", Integer),
    Column("gpu_class", Text),
    Column("hca_count", Integer),
    Column("hca_rate_gbps", Integer),
    Column("nvlink_group_size", Integer),
    Column("memory_total_mb", Integer),
    Column("actor", Text),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Where a node differs from its profile (Node.drift), one row per kind. The
# policy's taint for it is its remediation's (remediation_id, migration
# 0019), ended when the finding clears; taint_on is where the scope put it
# (NULL: the node). tainted: the finding holds the taint itself, when no
# remediation could (a node that reports no GPUs), or it was found before
# drift made remediations.
drift_findings = Table(
    "drift_findings",
    metadata,
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("kind", Text, nullable=False),
    Column("expected", Text, nullable=False),
    Column("observed", Text, nullable=False),
    # The GPUs that explain it; NULL: the node as a whole.
    Column("gpu_indices", ARRAY(Integer)),
    Column("taint_on", ARRAY(Integer)),
    Column("tainted", Boolean, nullable=False),
    Column("since", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("remediation_id", BigInteger, ForeignKey("remediations.id", ondelete="SET NULL")),
    PrimaryKeyConstraint("node_id", "kind"),
    CheckConstraint(
        "kind IN ('GPU_MISSING', 'GPU_CLASS_CHANGED', 'HCA_MISSING', 'HCA_RATE_LOW',"
        " 'NVLINK_DEGRADED', 'MEMORY_LOW')",
        name="kind",
    ),
)
