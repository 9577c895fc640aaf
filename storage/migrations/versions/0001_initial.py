"""Initial schema: runs, incarnations, per-step records, cursors, gaps, findings.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
RUN = sa.String(128)
# Per-step tables are clustered on their key in SQLite (one B-tree per row written, not
# two): ingest speed. The key (run, incarnation, step) also serves reading a run by step.
CLUSTERED = {"sqlite_with_rowid": False}


def _run_inc_step() -> list[sa.Column]:
    return [
        sa.Column("run", RUN, nullable=False),
        sa.Column("incarnation", sa.Integer, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("ts_ns", sa.BigInteger),
    ]


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run", RUN, primary_key=True),
        sa.Column("jobset", sa.String(253)),
        sa.Column("namespace", sa.String(253)),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "incarnations",
        sa.Column("run", RUN, nullable=False),
        sa.Column("incarnation", sa.Integer, nullable=False),
        sa.Column("started_ns", sa.BigInteger),
        # True when the trainer's start-up line was read: following began before step 1.
        sa.Column("saw_start", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("first_step", sa.Integer),
        sa.Column("last_step", sa.Integer),
        sa.Column("restored_from", sa.Integer),
        sa.Column("process_index", sa.Integer),
        sa.Column("process_count", sa.Integer),
        sa.Column("pod", sa.String(253)),
        sa.PrimaryKeyConstraint("run", "incarnation"),
    )
    op.create_table(
        "loss_parts",
        *_run_inc_step(),
        sa.Column("ce", sa.Float(53)),  # NULL when not finite; ce_raw says which
        sa.Column("ce_raw", sa.String(64), nullable=False),
        sa.Column("parts", JSON, nullable=False),
        sa.PrimaryKeyConstraint("run", "incarnation", "step"),
        **CLUSTERED,
    )
    if op.get_bind().dialect.name == "postgresql":
        # Grafana's shared store: steps across incarnations and "recently active" scans.
        op.create_index("ix_loss_parts_run_step", "loss_parts", ["run", "step"])
        op.create_index("ix_loss_parts_ts", "loss_parts", ["ts_ns"])
    op.create_table(
        "required_rbf",
        *_run_inc_step(),
        sa.Column("max", sa.Float(53)),
        sa.Column("per_layer", JSON, nullable=False),
        sa.Column("program", sa.String(128)),
        sa.PrimaryKeyConstraint("run", "incarnation", "step"),
        **CLUSTERED,
    )
    op.create_table(
        "pod_metrics",
        *_run_inc_step(),
        sa.Column("seconds", sa.Float(53)),
        sa.Column("tflops", sa.Float(53)),
        sa.Column("tokens_per_s", sa.Float(53)),
        sa.Column("total_weights", sa.BigInteger),
        sa.Column("loss", sa.Float(53)),  # the per-pod loss: never the loss of record
        sa.Column("extra", JSON, nullable=False),
        sa.PrimaryKeyConstraint("run", "incarnation", "step"),
        **CLUSTERED,
    )
    op.create_table(
        "config",
        sa.Column("run", RUN, nullable=False),
        sa.Column("incarnation", sa.Integer, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("value", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("run", "incarnation", "name"),
    )
    op.create_table(
        "checkpoints",
        sa.Column("run", RUN, nullable=False),
        sa.Column("incarnation", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("ts_ns", sa.BigInteger),
        sa.PrimaryKeyConstraint("run", "incarnation", "kind", "step"),
    )
    op.create_table(
        "ingest_stats",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run", RUN, nullable=False, index=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("sha256", sa.String(64)),
        sa.Column("started_ns", sa.BigInteger, nullable=False),
        sa.Column("finished_ns", sa.BigInteger, nullable=False),
        sa.Column("lines", sa.BigInteger, nullable=False),
        sa.Column("loss_parts", sa.Integer, nullable=False),
        sa.Column("required_rbf", sa.Integer, nullable=False),
        sa.Column("pod_steps", sa.Integer, nullable=False),
        sa.Column("bad_lines", sa.Integer, nullable=False),
        sa.Column("duplicates", sa.Integer, nullable=False),
        sa.Column("bad_samples", JSON, nullable=False),
    )
    op.create_table(
        "cursors",
        sa.Column("run", RUN, nullable=False),
        sa.Column("stream", sa.String(512), nullable=False),
        sa.Column("hwm_ns", sa.BigInteger),
        sa.Column("at_hwm", JSON, nullable=False),  # digests of the lines read at hwm_ns
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("run", "stream"),
    )
    op.create_table(
        "stream_gaps",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run", RUN, nullable=False),
        sa.Column("stream", sa.String(512), nullable=False),
        sa.Column("start_ns", sa.BigInteger, nullable=False),
        sa.Column("end_ns", sa.BigInteger),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("detected_ns", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("run", "stream", "start_ns", name="uq_stream_gaps"),
    )
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run", RUN, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("incarnation", sa.Integer, nullable=False),  # 0 when not tied to one
        sa.Column("first_step", sa.Integer, nullable=False),  # -1 when not tied to a step
        sa.Column("last_step", sa.Integer, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("detected_ns", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("run", "kind", "incarnation", "first_step", name="uq_findings"),
    )


def downgrade() -> None:
    for table in (
        "findings", "stream_gaps", "cursors", "ingest_stats", "checkpoints", "config",
        "pod_metrics", "required_rbf", "loss_parts", "incarnations", "runs",
    ):
        op.drop_table(table)
