"""Stream reconnects: each stream the follower re-opened (silence, EOF), so the Fleet board
and exports can count them across collector restarts.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stream_reconnects",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run", sa.String(128), nullable=False),
        sa.Column("stream", sa.String(512), nullable=False),
        sa.Column("ts_ns", sa.BigInteger, nullable=False),  # when the stream was re-opened
        sa.Column("reason", sa.String(64), nullable=False),  # silence | eof
    )
    op.create_index("ix_stream_reconnects_run", "stream_reconnects", ["run"])


def downgrade() -> None:
    op.drop_index("ix_stream_reconnects_run", "stream_reconnects")
    op.drop_table("stream_reconnects")
