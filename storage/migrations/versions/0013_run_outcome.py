"""What the collector saw of a run's end (completed, failed), for the run's state.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # filled by its issue's work


def downgrade() -> None:
    pass
