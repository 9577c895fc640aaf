"""Cursors remember a stream read to its end (`done`), so a collector that starts again knows
which streams of vanished pods are complete and which were cut off while it was away.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Streams of older stores count as read to their end: nothing is known to be missing.
    with op.batch_alter_table("cursors") as batch:
        batch.add_column(sa.Column("done", sa.Boolean, nullable=False, server_default=sa.true()))
    with op.batch_alter_table("cursors") as batch:
        batch.alter_column("done", server_default=sa.false())


def downgrade() -> None:
    with op.batch_alter_table("cursors") as batch:
        batch.drop_column("done")
