"""Maintenance windows' tables (issue 47; migration 0025): the windows, their nodes, the replicas asked to move.

Part of the schema: every table here is on service/tables.py's metadata,
apart only to keep each module one idea, as service/tenancy_tables.py is.
Whoever reads the whole schema from the metadata imports this module too:
alembic/env.py, tests/operations/test_migrations.py. What the rows mean is
service/fleet/maintenance/'s; which nodes placement avoids because of them is
service/scheduling/maintenance_rule.py's.
"""

from sqlalchemy import (
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

from service.bounds import id_length_check
from service.scheduling.maintenance_rule import MaintenanceState
from service.tables import metadata

# A maintenance window: its nodes leave placement from drain_at
# (start_at - drain_lead seconds), their replicas are asked to move, and
# from start_at to end_at ([start, end), half-open) the nodes take nothing.
# `state` is moved on by whichever service process is up, once per
# transition (conditional UPDATEs: service/fleet/maintenance/transitions.py).
maintenance_windows = Table(
    "maintenance_windows",
    metadata,
    Column("id", Text, primary_key=True),
    Column("start_at", DateTime(timezone=True), nullable=False),
    Column("end_at", DateTime(timezone=True), nullable=False),
    Column("drain_lead", Integer, nullable=False),
    Column("drain_at", DateTime(timezone=True), nullable=False),
    Column("reason", Text, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'SCHEDULED'")),
    Column("actor", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # When `state` last changed.
    Column("changed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(id_length_check("id"), name="id_length"),
    CheckConstraint("end_at > start_at", name="window"),
    CheckConstraint("drain_lead >= 0", name="drain_lead"),
    CheckConstraint(
        "state IN (" + ", ".join(f"'{s.value}'" for s in MaintenanceState) + ")", name="state"
    ),
)
# The windows a transition may be due for: few at any time, whatever the history.
Index(
    "ix_maintenance_windows_open",
    maintenance_windows.c.drain_at,
    postgresql_where=text("state IN ('SCHEDULED', 'DRAINING', 'IN_PROGRESS')"),
)

# The nodes of a window. A removed node leaves its windows.
maintenance_nodes = Table(
    "maintenance_nodes",
    metadata,
    Column(
        "window_id",
        Text,
        ForeignKey("maintenance_windows.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("node_id", Text, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    PrimaryKeyConstraint("window_id", "node_id"),
)
# Placement's probe (maintenance_rule.maintenance_on): the windows of one node.
Index("ix_maintenance_nodes_node_id", maintenance_nodes.c.node_id)

# The replicas a window asked to move (a wave: service/fleet/maintenance/waves.py),
# kept until the window ends; the replica's shards on the window's nodes are
# in shardsToMove while it is placed.
maintenance_moves = Table(
    "maintenance_moves",
    metadata,
    Column(
        "window_id",
        Text,
        ForeignKey("maintenance_windows.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("replica_id", Text, nullable=False),
    Column("asked_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("window_id", "replica_id"),
)
# Outstanding asks of a replica, whichever window made them (a wave counts them per deployment).
Index("ix_maintenance_moves_replica_id", maintenance_moves.c.replica_id)
