"""Files kept beside the store for a run: raw process-0 log segments written by `follow --raw`
and the pod-log archives of `steptail archive` (their manifest), so `export` and `reparse`
find them and can check them against their sha256. And `ingest_stats.content_sha256`: the
sha256 column now holds the ingested file's own hash (a .gz as stored); an untimestamped
log's identity for dedupe is its content's (the same log plain or gzipped is one log).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_files",
        sa.Column("run", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),  # raw_segment | archive_manifest
        sa.Column("path", sa.Text, nullable=False),  # absolute
        sa.Column("sha256", sa.String(64)),  # None while a segment is still being written
        sa.Column("bytes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("lines", sa.BigInteger),
        sa.Column("first_ns", sa.BigInteger),
        sa.Column("last_ns", sa.BigInteger),
        sa.Column("recorded_ns", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("run", "kind", "path"),
    )
    with op.batch_alter_table("ingest_stats") as batch:
        batch.add_column(sa.Column("content_sha256", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("ingest_stats") as batch:
        batch.drop_column("content_sha256")
    op.drop_table("run_files")
