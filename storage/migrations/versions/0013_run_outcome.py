"""What the collector saw of a run's end (completed, failed), for the run's state
(steptail.runs.state): `outcome`, when (`outcome_ns`) and why (`outcome_reason`), and
`followed_ns`, the heartbeat of the collector following it (its liveness, not the run's).
NULL for runs ingested from files, and for followed runs until the collector sees an end.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

COLUMNS = (("outcome", sa.String(16)), ("outcome_ns", sa.BigInteger), ("outcome_reason", sa.Text),
           ("followed_ns", sa.BigInteger))


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
