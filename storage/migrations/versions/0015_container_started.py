"""Each incarnation's container start (the pod's containerStatuses startedAt, whole seconds),
as `follow` saw it: the end of the wait a restart spent with no container running (goodput's
`queued_s`) and the start of a run's wall time. NULL for runs ingested from files.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("incarnations") as batch:
        batch.add_column(sa.Column("container_started_ns", sa.BigInteger))
    # 0014's goodput state, filled from the rows stored before: the computation a commit does,
    # over each run's rows. Here, not in 0014: it runs today's code, which reads this column
    # (a store already at 0014 gets the same figures again).
    from steptail.storage.goodput import rebuild

    bind = op.get_bind()
    for (run,) in bind.execute(sa.text("SELECT DISTINCT run FROM loss_summary")).fetchall():
        rebuild(bind, run)


def downgrade() -> None:
    with op.batch_alter_table("incarnations") as batch:
        batch.drop_column("container_started_ns")
