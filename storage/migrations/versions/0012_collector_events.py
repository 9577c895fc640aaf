"""The collector's own trouble (a failure starting and clearing), kept as health, not as findings of a run.

One row per spell of one source failing (a run's follower, its Parquet writes, pod discovery):
when it started and cleared, why, how many failed attempts, and whether steps were lost in
it (a gap finding then names it as its cause). `run` is "" for pod discovery (every run).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "collector_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run", sa.String(128), nullable=False, server_default=""),
        sa.Column("kind", sa.String(32), nullable=False),  # auth_failure | stream_failure | parquet_failure
        sa.Column("source", sa.String(32), nullable=False),  # follower, stream content, buffer, parquet, discovery
        sa.Column("started_ns", sa.BigInteger, nullable=False),
        sa.Column("cleared_ns", sa.BigInteger),  # NULL: open (or the collector stopped before it cleared)
        sa.Column("reason", sa.String(600), nullable=False),
        sa.Column("failures", sa.Integer, nullable=False, server_default="1"),
        sa.Column("lost_steps", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.UniqueConstraint("run", "source", "started_ns", name="uq_collector_events"),
    )
    op.create_index("ix_collector_events_run", "collector_events", ["run", "started_ns"])


def downgrade() -> None:
    op.drop_index("ix_collector_events_run", "collector_events")
    op.drop_table("collector_events")
