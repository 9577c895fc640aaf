"""The collector's own trouble (a failure starting and clearing), kept as health, not as findings of a run.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # filled by its issue's work


def downgrade() -> None:
    pass
