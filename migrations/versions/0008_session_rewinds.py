"""Rewind: the audit table of rewinds and the ``line_of`` mark of a kept line.

``session_rewinds`` has one row per rewind: the id rewound, the id its old line is kept
under, the row that holds that line (renamed) and the row made for the id, from which
head (and its hash) to which version, when, by whom and why. ``sessions.line_of`` (a
plain nullable ``ADD COLUMN``) marks a kept line with the pk of the row the rewind made
for the id it was rewound away from.

Revision ID: 0008_session_rewinds
Revises: 0006_notify_after_commit
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_session_rewinds"
down_revision = "0006_notify_after_commit"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("line_of", sa.Integer(), nullable=True))
    op.create_table(
        "session_rewinds",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("kept_id", sa.Text(), nullable=False),
        sa.Column("kept_pk", sa.Integer(), nullable=False),
        sa.Column("new_pk", sa.Integer(), nullable=False),
        sa.Column("from_head", sa.Integer(), nullable=False),
        sa.Column("from_hash", sa.LargeBinary(), nullable=False),
        sa.Column("to_version", sa.Integer(), nullable=False),
        sa.Column("rewound_at", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("seq", name="pk_session_rewinds"),
        sa.UniqueConstraint("kept_id", name="uq_session_rewinds_kept_id"),
        sa.UniqueConstraint("kept_pk", name="uq_session_rewinds_kept_pk"),
        sa.UniqueConstraint("new_pk", name="uq_session_rewinds_new_pk"),
    )
    op.create_index("ix_session_rewinds_session_id", "session_rewinds", ["session_id"])


def downgrade() -> None:
    op.drop_index("ix_session_rewinds_session_id", table_name="session_rewinds")
    op.drop_table("session_rewinds")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("line_of")
