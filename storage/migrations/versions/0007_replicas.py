"""Replicas of `follow` sharing one PostgreSQL store: `replicas` (one row per live process, its
heartbeat and the backend that holds its advisory locks) and `run_owners` (who follows a run,
since when, and the epoch that fences its commits: a new owner bumps it, and a commit carrying
an older one is refused).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("replica", sa.String(128), primary_key=True),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("backend_pid", sa.Integer, nullable=False),  # holds the replica's advisory locks
        sa.Column("started_ns", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_ns", sa.BigInteger, nullable=False),
        sa.Column("runs", sa.Integer, nullable=False, server_default="0"),  # runs owned now
    )
    op.create_table(
        "run_owners",
        sa.Column("run", sa.String(256), primary_key=True),
        sa.Column("replica", sa.String(128), nullable=False),
        sa.Column("since_ns", sa.BigInteger, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("run_owners")
    op.drop_table("replicas")
