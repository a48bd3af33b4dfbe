"""inventory schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02 10:54:07.632345
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("digest", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("node_id", sa.Text(), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "(role = 'agent') = (node_id IS NOT NULL)", name=op.f("ck_api_tokens_agent_node")
        ),
        sa.CheckConstraint(
            "role IN ('reader', 'agent', 'scheduler', 'operator')", name=op.f("ck_api_tokens_role")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("digest", name=op.f("uq_api_tokens_digest")),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("node_id", sa.Text(), nullable=True),
        sa.Column("replica_id", sa.Text(), nullable=True),
        sa.Column("shard_id", sa.Text(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "detail",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_at", "events", ["at"], unique=False)
    op.create_index("ix_events_node_id", "events", ["node_id", "id"], unique=False)
    op.create_index("ix_events_replica_id", "events", ["replica_id", "id"], unique=False)
    op.create_table(
        "nodes",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("mgmt_addr", sa.Text(), nullable=False),
        sa.Column(
            "labels",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("memory_total_mb", sa.Integer(), nullable=True),
        sa.Column("agent_version", sa.Text(), nullable=True),
        sa.Column(
            "engine_versions",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("admin_state", sa.Text(), nullable=True),
        sa.Column("admin_reason", sa.Text(), nullable=True),
        sa.Column("admin_actor", sa.Text(), nullable=True),
        sa.Column("liveness", sa.Text(), server_default="alive", nullable=False),
        sa.Column("liveness_reason", sa.Text(), nullable=True),
        sa.Column(
            "state",
            sa.Text(),
            sa.Computed(
                "CASE WHEN liveness <> 'alive' THEN liveness WHEN admin_state IS NOT NULL THEN admin_state ELSE 'ready' END",
                persisted=True,
            ),
            nullable=False,
        ),
        sa.Column("local_disk_free", sa.BigInteger(), nullable=True),
        sa.Column("local_disk_total", sa.BigInteger(), nullable=True),
        sa.Column("shared_disk_free", sa.BigInteger(), nullable=True),
        sa.Column("shared_disk_total", sa.BigInteger(), nullable=True),
        sa.Column(
            "knows_its_weights", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column("report_digest", sa.Text(), nullable=True),
        sa.Column(
            "registered_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "reported_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "last_seen", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint(
            "admin_state IN ('cordoned', 'draining')", name=op.f("ck_nodes_admin_state")
        ),
        sa.CheckConstraint(
            "liveness IN ('alive', 'unreachable', 'lost')", name=op.f("ck_nodes_liveness")
        ),
        sa.CheckConstraint("char_length(id) BETWEEN 1 AND 253", name=op.f("ck_nodes_id_length")),
        sa.CheckConstraint(
            "local_disk_free BETWEEN 0 AND local_disk_total AND shared_disk_free BETWEEN 0 AND shared_disk_total",
            name=op.f("ck_nodes_disk"),
        ),
        sa.CheckConstraint("memory_total_mb >= 0", name=op.f("ck_nodes_memory")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
    )
    op.create_index("ix_nodes_labels", "nodes", ["labels"], unique=False, postgresql_using="gin")
    op.create_index("ix_nodes_last_seen", "nodes", ["last_seen"], unique=False)
    op.create_index("ix_nodes_state_id", "nodes", ["state", "id"], unique=False)
    op.create_table(
        "fabric_attachments",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("fabric", sa.Text(), nullable=False),
        sa.Column("hcas", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("rate_gbps", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "char_length(fabric) BETWEEN 1 AND 253",
            name=op.f("ck_fabric_attachments_fabric_length"),
        ),
        sa.CheckConstraint("rate_gbps >= 0", name=op.f("ck_fabric_attachments_rate")),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_fabric_attachments_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", "fabric", name=op.f("pk_fabric_attachments")),
    )
    op.create_index(
        "ix_fabric_attachments_fabric", "fabric_attachments", ["fabric", "node_id"], unique=False
    )
    op.create_table(
        "filesystems",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("fs_id", sa.Text(), nullable=False),
        sa.Column("mount_point", sa.Text(), nullable=False),
        sa.Column("fs_type", sa.Text(), nullable=True),
        sa.Column("shared", sa.Boolean(), nullable=False),
        sa.Column("free_bytes", sa.BigInteger(), nullable=False),
        sa.Column("total_bytes", sa.BigInteger(), nullable=False),
        sa.Column(
            "directories",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "free_bytes BETWEEN 0 AND total_bytes", name=op.f("ck_filesystems_bytes")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_filesystems_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node_id", "fs_id", name=op.f("pk_filesystems")),
    )
    op.create_table(
        "gpu_pools",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("gpu_class", sa.Text(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("unhealthy", sa.Integer(), nullable=False),
        sa.Column("allocated", sa.Integer(), nullable=False),
        sa.Column("free", sa.Integer(), nullable=False),
        sa.Column("schedulable", sa.Boolean(), nullable=False),
        sa.CheckConstraint("free >= 0 AND free <= total", name=op.f("ck_gpu_pools_free")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_gpu_pools_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node_id", "gpu_class", name=op.f("pk_gpu_pools")),
    )
    op.create_index(
        "ix_gpu_pools_free",
        "gpu_pools",
        ["gpu_class", "node_id"],
        unique=False,
        postgresql_where=sa.text("schedulable AND free > 0"),
    )
    op.create_table(
        "gpus",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.Text(), nullable=True),
        sa.Column("pci_bus_id", sa.Text(), nullable=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("gpu_class", sa.Text(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=True),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column(
            "health_reasons",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.CheckConstraint("idx >= 0", name=op.f("ck_gpus_idx")),
        sa.CheckConstraint("memory_mb >= 0", name=op.f("ck_gpus_memory")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_gpus_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node_id", "idx", name=op.f("pk_gpus")),
    )
    op.create_table(
        "shards",
        sa.Column("shard_id", sa.Text(), nullable=False),
        sa.Column("replica_id", sa.Text(), nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("gpu_indices", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("fabric", sa.Text(), nullable=True),
        sa.Column(
            "hcas", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("cardinality(gpu_indices) > 0", name=op.f("ck_shards_gpu_indices")),
        sa.CheckConstraint(
            "char_length(replica_id) BETWEEN 1 AND 253", name=op.f("ck_shards_replica_id_length")
        ),
        sa.CheckConstraint(
            "char_length(shard_id) BETWEEN 1 AND 253", name=op.f("ck_shards_shard_id_length")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_shards_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("shard_id", name=op.f("pk_shards")),
    )
    op.create_index("ix_shards_node_id", "shards", ["node_id"], unique=False)
    op.create_index("ix_shards_replica_id", "shards", ["replica_id"], unique=False)
    op.create_table(
        "weights",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("size_bytes >= 0", name=op.f("ck_weights_size")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_weights_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node_id", "path", name=op.f("pk_weights")),
    )
    op.create_index("ix_weights_path", "weights", ["path", "node_id"], unique=False)
    op.create_table(
        "allocated_gpus",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("shard_id", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_allocated_gpus_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["shard_id"],
            ["shards.shard_id"],
            name=op.f("fk_allocated_gpus_shard_id_shards"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", "gpu_index", name=op.f("pk_allocated_gpus")),
    )
    op.create_index("ix_allocated_gpus_shard_id", "allocated_gpus", ["shard_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_allocated_gpus_shard_id", table_name="allocated_gpus")
    op.drop_table("allocated_gpus")
    op.drop_index("ix_weights_path", table_name="weights")
    op.drop_table("weights")
    op.drop_index("ix_shards_replica_id", table_name="shards")
    op.drop_index("ix_shards_node_id", table_name="shards")
    op.drop_table("shards")
    op.drop_table("gpus")
    op.drop_index(
        "ix_gpu_pools_free",
        table_name="gpu_pools",
        postgresql_where=sa.text("schedulable AND free > 0"),
    )
    op.drop_table("gpu_pools")
    op.drop_table("filesystems")
    op.drop_index("ix_fabric_attachments_fabric", table_name="fabric_attachments")
    op.drop_table("fabric_attachments")
    op.drop_index("ix_nodes_state_id", table_name="nodes")
    op.drop_index("ix_nodes_last_seen", table_name="nodes")
    op.drop_index("ix_nodes_labels", table_name="nodes", postgresql_using="gin")
    op.drop_table("nodes")
    op.drop_index("ix_events_replica_id", table_name="events")
    op.drop_index("ix_events_node_id", table_name="events")
    op.drop_index("ix_events_at", table_name="events")
    op.drop_table("events")
    op.drop_table("api_tokens")
