"""Per-run state kept at each commit (storage.summary), so that alerts and panels read it
instead of aggregating every step ever stored: their cost follows the live runs, not the
store's history.

- `loss_summary`: per incarnation, its LOSS-PARTS row count, lowest and highest step, and
  earliest and latest kubelet timestamp; `last_ts_ns` indexed: "runs that logged a step in
  the window" is a range scan.
- `loss_rollup`: per block of 16 steps, its count, extremes and first NaN: what a by-step
  panel reads once a point stands for 16 steps or more.
- `ix_findings_detected`, `ix_runs_updated`: "findings detected in the window" and "runs
  written to since" are range scans too.

All filled from the rows already stored.

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
    # Blocks of 16 steps: what a by-step panel needs once a point stands for 16 steps or more.
    op.create_table(
        "loss_rollup",
        sa.Column("run", sa.String(128), nullable=False),
        sa.Column("incarnation", sa.Integer, nullable=False),
        sa.Column("block", sa.Integer, nullable=False),  # step / 16
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("s0", sa.Integer, nullable=False),  # its lowest and highest step
        sa.Column("s1", sa.Integer, nullable=False),
        sa.Column("ce_lo", sa.Float(53)),  # lowest and highest finite CE, NULL when none
        sa.Column("ce_hi", sa.Float(53)),
        sa.Column("nan_step", sa.Integer),  # its first step whose CE is not finite
        sa.PrimaryKeyConstraint("run", "incarnation", "block"),
    )
    # The alerts' "findings detected in the window", without reading every finding stored.
    op.create_index("ix_findings_detected", "findings", ["detected_ns"])
    op.create_index("ix_runs_updated", "runs", ["updated_ns"])
    if op.get_bind().dialect.name == "postgresql":
        # Its one reader was the alerts' scan for recent steps, now ix_loss_summary_last_ts:
        # one index less to keep up on every row written.
        op.drop_index("ix_loss_parts_ts", "loss_parts")
    op.execute(
        "INSERT INTO loss_summary (run, incarnation, steps, lo, hi, first_ts_ns, last_ts_ns)"
        " SELECT run, incarnation, COUNT(*), MIN(step), MAX(step), MIN(ts_ns), MAX(ts_ns)"
        " FROM loss_parts GROUP BY run, incarnation"
    )
    op.execute(
        "INSERT INTO loss_rollup (run, incarnation, block, steps, s0, s1, ce_lo, ce_hi, nan_step)"
        " SELECT run, incarnation, step / 16, COUNT(*), MIN(step), MAX(step), MIN(ce), MAX(ce),"
        " MIN(CASE WHEN ce IS NULL THEN step END) FROM loss_parts GROUP BY run, incarnation, step / 16"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_loss_parts_ts", "loss_parts", ["ts_ns"])
    op.drop_index("ix_runs_updated", "runs")
    op.drop_index("ix_findings_detected", "findings")
    op.drop_table("loss_rollup")
    op.drop_index("ix_loss_summary_last_ts", "loss_summary")
    op.drop_table("loss_summary")
