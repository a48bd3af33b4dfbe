"""gpu_pools keeps its free GPUs' indices: a freeGpus page is one index walk

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 08:40:00

Issue 30: a page of freeGpus read its nodes from gpu_pools, then the page's
GPUs and allocations by `node_id = ANY(ARRAY(SELECT ... FROM page))`. The
planner estimates that array at one row whatever it holds, and before the
first ANALYZE every table at a handful of rows, so on a cluster just
registered it chose nested loops that rescanned the page's GPUs and
allocations once per page row: a page of a thousand ran into the request's
time limit. With the free indices on the pool row (written by the statements
that write `free`: gpu_pools.refresh_pools' recount, the report upsert's
recount, move_to_allocated's delta), a page is a walk of ix_gpu_pools_free
and nothing else, so there is no join left for the planner to get wrong.

- free_indices: backfilled by the recount availability.pool_counts does
  (written out here as it stands at this revision), then NOT NULL with no
  default, so a writer that forgets it fails instead of offering nothing.
- Check free_indices: its length is `free`, so the two can never disagree.
- ix_gpu_pools_free includes free_indices, so the walk is index-only once
  vacuum has marked the pages visible. No write costs more: a change of
  free_indices changes `free`, already a key of ix_gpu_pools_fit.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# availability.pool_offers("") as it stands at this revision.
OFFERS = sa.text("schedulable AND free > 0")

# availability.gpu_free_given over gpus g and allocated_gpus a, as it stands
# at this revision.
_BACKFILL = """
    UPDATE gpu_pools p SET free_indices = coalesce(f.indices, '{}')
    FROM (
        SELECT q.node_id, q.gpu_class,
               ARRAY(SELECT g.idx FROM gpus g
                     WHERE g.node_id = q.node_id AND g.gpu_class = q.gpu_class
                       AND g.healthy AND cardinality(g.sticky_reasons) = 0
                       AND g.cordon_reason IS NULL
                       AND NOT EXISTS (SELECT 1 FROM allocated_gpus a
                                       WHERE a.node_id = g.node_id AND a.gpu_index = g.idx)
                     ORDER BY g.idx) AS indices
        FROM gpu_pools q
    ) f
    WHERE f.node_id = p.node_id AND f.gpu_class = p.gpu_class
"""


def _pools_free_index(include: list[str]) -> None:
    op.create_index(
        "ix_gpu_pools_free",
        "gpu_pools",
        ["gpu_class", "node_id"],
        unique=False,
        postgresql_include=include,
        postgresql_where=OFFERS,
    )


def upgrade() -> None:
    op.add_column(
        "gpu_pools",
        sa.Column(
            "free_indices",
            postgresql.ARRAY(sa.Integer()),
            nullable=False,
            server_default=sa.text("'{}'"),
        ),
    )
    op.execute(_BACKFILL)
    op.alter_column("gpu_pools", "free_indices", server_default=None)
    op.create_check_constraint(
        op.f("ck_gpu_pools_free_indices"), "gpu_pools", "cardinality(free_indices) = free"
    )
    op.drop_index("ix_gpu_pools_free", table_name="gpu_pools", postgresql_where=OFFERS)
    _pools_free_index(["free", "free_indices"])


def downgrade() -> None:
    op.drop_index("ix_gpu_pools_free", table_name="gpu_pools", postgresql_where=OFFERS)
    _pools_free_index(["free"])
    op.drop_constraint(op.f("ck_gpu_pools_free_indices"), "gpu_pools", type_="check")
    op.drop_column("gpu_pools", "free_indices")
