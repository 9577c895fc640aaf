"""What each incarnation ran on: its process-0 pod's image and imageID (the digest the
kubelet ran), the slice topology and the JobSet's host count, read off the cluster by
`follow`; NULL for runs ingested from files. The ledger export carries them: which image
produced which steps.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

COLUMNS = (("image", sa.String(512)), ("image_id", sa.String(512)), ("topology", sa.String(64)),
           ("hosts", sa.Integer))


def upgrade() -> None:
    with op.batch_alter_table("incarnations") as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind))


def downgrade() -> None:
    with op.batch_alter_table("incarnations") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
