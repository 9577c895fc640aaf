"""The run's evaluation inputs (a reference CE given once, with its source) and superseded findings: a stored verdict is never silently replaced.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # filled by its issue's work


def downgrade() -> None:
    pass
