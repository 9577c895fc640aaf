"""Alert outbox: one row per (finding, webhook), written in the transaction that stores the
finding, so a delivery survives a crash or a dead receiver and is sent at least once.

The webhook is stored as the SHA-256 of its URL (the URL's path or query often carries a
secret); `webhook_host` is its redacted scheme://host[:port], for people reading the table.
`lease_ns` is set while a collector has the row in flight, so two collectors sharing a store
do not both send it; a lease left by a killed collector simply expires.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_outbox",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        # run/kind/incarnation/first_step: the receiver's idempotency key
        sa.Column("finding_id", sa.String(600), nullable=False),
        sa.Column("webhook", sa.String(64), nullable=False),
        sa.Column("webhook_host", sa.String(300), nullable=False),
        sa.Column("run", sa.String(128), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),  # the JSON body POSTed
        sa.Column("state", sa.String(16), nullable=False, server_default="pending"),  # | delivered | rejected
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("last_attempt_ns", sa.BigInteger),
        sa.Column("delivered_ns", sa.BigInteger),
        sa.Column("lease_ns", sa.BigInteger),
        sa.Column("last_error", sa.String(200)),
        sa.UniqueConstraint("finding_id", "webhook", name="uq_alert_outbox"),
    )
    op.create_index("ix_alert_outbox_pending", "alert_outbox", ["webhook", "state", "id"])


def downgrade() -> None:
    op.drop_index("ix_alert_outbox_pending", "alert_outbox")
    op.drop_table("alert_outbox")
