"""Streaming turns: the writer lease of a session and whether the session is closed.

Four nullable columns on ``sessions``: ``writer`` (the token of the turn that owns the
session's stream) and ``writer_seen`` (when that turn last flushed or renewed its lease,
microseconds since the Unix epoch), ``closed_at`` and ``closed_reason``.

Revision ID: 0004_turn_leases
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_turn_leases"
down_revision = "0003_feed"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("writer", sa.Text()),
    ("writer_seen", sa.BigInteger()),
    ("closed_at", sa.BigInteger()),
    ("closed_reason", sa.Text()),
)


def upgrade() -> None:
    # Plain ADD COLUMN (nullable, no default): SQLite needs no table rebuild for it.
    for name, type_ in _COLUMNS:
        op.add_column("sessions", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        for name, _ in reversed(_COLUMNS):
            batch.drop_column(name)
