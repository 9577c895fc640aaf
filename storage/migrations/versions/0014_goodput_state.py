"""Goodput kept as state at commit (docs/goodput.md, storage.goodput), so that `steptail
goodput`, the API, /metrics, the Grafana panel and the mesh table read a run's few rows
instead of every step it logged:

- `goodput_blocks`: per block of 256 steps of an incarnation, its state (runs.goodput
  block_state, JSON): what a commit recomputes for the blocks its rows touch;
- `goodput_incs`: per incarnation, its blocks added up (JSON);
- `run_goodput`: per run, the figures (`report`: `steptail goodput -o json`) and, as columns
  for SQL readers (Grafana), the split, goodput and the latest incarnation's median step time.

Filled from the rows already stored by 0015 (the fill runs today's storage.goodput, which
reads 0015's column).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

FIGURES = ("wall_s", "productive_s", "replayed_s", "recovery_s", "checkpoint_s", "other_s", "goodput",
           "median_step_s")


def upgrade() -> None:
    op.create_table(
        "goodput_blocks",
        sa.Column("run", sa.String(128), nullable=False),
        sa.Column("incarnation", sa.Integer, nullable=False),
        sa.Column("block", sa.BigInteger, nullable=False),  # step // 256
        sa.Column("state", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("run", "incarnation", "block"),
    )
    op.create_table(
        "goodput_incs",
        sa.Column("run", sa.String(128), nullable=False),
        sa.Column("incarnation", sa.Integer, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("run", "incarnation"),
    )
    op.create_table(
        "run_goodput",
        sa.Column("run", sa.String(128), primary_key=True),
        *[sa.Column(name, sa.Float(53)) for name in FIGURES],  # NULL: not evaluable
        sa.Column("report", sa.Text, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_goodput")
    op.drop_table("goodput_incs")
    op.drop_table("goodput_blocks")
