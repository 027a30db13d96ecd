"""Rewind: the audit table of rewinds.

``session_rewinds`` has one row per rewind: the id rewound, the id its old line is kept
under, the row that holds that line (renamed) and the row made for the id, from which
head (and its hash) to which version, when, by whom and why. A kept line is marked by
``sessions.line_of``, which revision 0007 added.

Revision ID: 0008_session_rewinds
Revises: 0007_session_catalogue
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_session_rewinds"
down_revision = "0007_session_catalogue"
branch_labels = None
depends_on = None


def upgrade() -> None:
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
