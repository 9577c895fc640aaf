"""`loss_summary`: per incarnation, how many LOSS-PARTS rows it holds, its lowest and highest
step, and its earliest and latest kubelet timestamp, kept at each commit (storage.summary).
The alert and panel queries read these instead of aggregating every step ever stored, so
their cost follows the live runs, not the store's history; `last_ts_ns` is indexed so that
"runs that logged a step in the window" is a range scan; so is "findings detected in the
window" (ix_findings_detected). Filled from the rows already stored.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "loss_summary",
        sa.Column("run", sa.String(128), nullable=False),
        sa.Column("incarnation", sa.Integer, nullable=False),
        sa.Column("steps", sa.BigInteger, nullable=False),  # rows: (run, incarnation, step) is unique
        sa.Column("lo", sa.Integer, nullable=False),
        sa.Column("hi", sa.Integer, nullable=False),
        sa.Column("first_ts_ns", sa.BigInteger),  # NULL while no row has a timestamp
        sa.Column("last_ts_ns", sa.BigInteger),
        sa.PrimaryKeyConstraint("run", "incarnation"),
    )
    op.create_index("ix_loss_summary_last_ts", "loss_summary", ["last_ts_ns"])
    # The alerts' "findings detected in the window", without reading every finding stored.
    op.create_index("ix_findings_detected", "findings", ["detected_ns"])
    if op.get_bind().dialect.name == "postgresql":
        # Its one reader was the alerts' scan for recent steps, now ix_loss_summary_last_ts:
        # one index less to keep up on every row written.
        op.drop_index("ix_loss_parts_ts", "loss_parts")
    op.execute(
        "INSERT INTO loss_summary (run, incarnation, steps, lo, hi, first_ts_ns, last_ts_ns)"
        " SELECT run, incarnation, COUNT(*), MIN(step), MAX(step), MIN(ts_ns), MAX(ts_ns)"
        " FROM loss_parts GROUP BY run, incarnation"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_loss_parts_ts", "loss_parts", ["ts_ns"])
    op.drop_index("ix_findings_detected", "findings")
    op.drop_index("ix_loss_summary_last_ts", "loss_summary")
    op.drop_table("loss_summary")
