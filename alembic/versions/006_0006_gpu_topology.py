"""GPU topology: NUMA node, NVLink peers and group, NVLink domain, near HCAs

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 05:30:00

Every column is nullable and NULL means "the agent did not say": a node
registered before this revision, or by an agent that cannot read its
topology, constrains nothing until a request needs the fact (then it is
TOPOLOGY_UNKNOWN, never "no NVLink"). nvlink_group is derived by the service
from the peers when the report is stored, so placement compares one integer
per GPU instead of walking peer lists.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("gpus", sa.Column("numa_node", sa.Integer()))
    op.add_column("gpus", sa.Column("nvlink_peers", ARRAY(sa.Integer())))
    op.add_column("gpus", sa.Column("nvlink_group", sa.Integer()))
    op.add_column("gpus", sa.Column("nvlink_domain", sa.Text()))
    op.add_column("gpus", sa.Column("near_hcas", ARRAY(sa.Text())))
    # op.f: the names as given, past the metadata's naming convention.
    op.create_check_constraint(op.f("ck_gpus_numa_node"), "gpus", "numa_node >= 0")
    op.create_check_constraint(
        op.f("ck_gpus_nvlink_group"), "gpus", "nvlink_group >= 0 AND nvlink_group <= idx"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_gpus_nvlink_group"), "gpus", type_="check")
    op.drop_constraint(op.f("ck_gpus_numa_node"), "gpus", type_="check")
    for column in ("near_hcas", "nvlink_domain", "nvlink_group", "nvlink_peers", "numa_node"):
        op.drop_column("gpus", column)
