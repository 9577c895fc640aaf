"""Run sources: where a run's data came from (`kubernetes:<namespace>/<jobset>` or `files`), so
that following a JobSet cannot silently append to a file-ingested run of the same name (or
the other way round). A run may hold several sources once `--append` said they are one run.

Existing runs are given the sources their rows already show: the JobSet they were followed
from, and `files` when anything was ingested into them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_sources",
        sa.Column("run", sa.String(128), nullable=False),
        # "kubernetes:" + namespace (<= 253) + "/" + JobSet (<= 253), or "files"
        sa.Column("source", sa.String(520), nullable=False),
        sa.Column("added_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("run", "source"),
    )
    op.execute(
        "INSERT INTO run_sources (run, source, added_ns)"
        " SELECT run, 'kubernetes:' || namespace || '/' || jobset, created_ns FROM runs"
        " WHERE jobset IS NOT NULL AND namespace IS NOT NULL"
    )
    op.execute(
        "INSERT INTO run_sources (run, source, added_ns)"
        " SELECT r.run, 'files', r.created_ns FROM runs r"
        " WHERE EXISTS (SELECT 1 FROM ingest_stats s WHERE s.run = r.run)"
    )


def downgrade() -> None:
    op.drop_table("run_sources")
