"""Quarantine: rows read from a log but kept out of their table, each with why — a row the
store refused (a value a column cannot hold; the other rows of its batch commit) or a step
that jumped absurdly. Nothing a line held is lost, and no such row blocks a commit.

`data` is the row as JSON text (ASCII, NUL escaped: not a JSON column, whose PostgreSQL type
refuses some of what is kept here); `digest` identifies it, so keeping it again adds nothing.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quarantine",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),  # the table the row was meant for
        sa.Column("incarnation", sa.Integer),
        sa.Column("step", sa.BigInteger),  # NULL when the row has none, or one beyond BIGINT
        sa.Column("ts_ns", sa.BigInteger),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("digest", sa.String(32), nullable=False),
        sa.Column("detected_ns", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("run", "digest", name="uq_quarantine"),
    )


def downgrade() -> None:
    op.drop_table("quarantine")
