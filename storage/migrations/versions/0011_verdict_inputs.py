"""The run's evaluation inputs (a reference CE given once, with its source) and superseded findings: a stored verdict is never silently replaced.

`reference_ce`: the HF reference CE per (run, step) the step-1 gate is evaluated against, as it
was given (`source`: the file, or the value on the command line; `given_by`: check, ingest,
reparse, follow). The current reference of a run is its rows with `superseded_ns` NULL; a
different one given later marks them superseded (when, by what) and adds its own.

`superseded_findings`: a finding as it was stored before a newer evaluation changed its severity
or verdict, or no longer raised it (`why`); the current findings stay in `findings`.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reference_ce",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run", sa.String(128), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("ce", sa.Float, nullable=False),
        sa.Column("source", sa.Text, nullable=False),  # a file path, or "--reference-ce 3.39"
        sa.Column("given_ns", sa.BigInteger, nullable=False),
        sa.Column("given_by", sa.String(32), nullable=False),
        sa.Column("superseded_ns", sa.BigInteger),
        sa.Column("superseded_by", sa.String(32)),
    )
    op.create_index("ix_reference_ce_run", "reference_ce", ["run", "step"])
    op.create_table(
        "superseded_findings",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("incarnation", sa.Integer, nullable=False),
        sa.Column("first_step", sa.Integer, nullable=False),
        sa.Column("last_step", sa.Integer, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("detected_ns", sa.BigInteger, nullable=False),
        sa.Column("superseded_ns", sa.BigInteger, nullable=False),
        sa.Column("superseded_by", sa.String(32), nullable=False),  # check | ingest | reparse | follow
        sa.Column("why", sa.Text, nullable=False),
    )
    op.create_index("ix_superseded_findings_run", "superseded_findings", ["run", "id"])


def downgrade() -> None:
    op.drop_index("ix_superseded_findings_run", "superseded_findings")
    op.drop_table("superseded_findings")
    op.drop_index("ix_reference_ce_run", "reference_ce")
    op.drop_table("reference_ce")
