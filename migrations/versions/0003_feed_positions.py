"""Feed positions: every event gets a feed number (``events.xact``), indexed in feed order.

PostgreSQL: ``xact`` defaults to the writing transaction's id (``pg_current_xact_id()``),
so every insert path records it; adding the column with that default rewrites the table
once, which gives the events recorded before this revision the migration's own id (the
backfill: they come first in the feed, each session's in version order). A statement-level
trigger sends one coalesced notification per writing transaction to wake followers.

SQLite: the insert gives ``xact`` (one writer at a time, so it grows in commit order); the
events recorded before get 0. ``feed_clock`` remembers the highest number a compaction or
erasure deleted, so it is never handed out again.

Revision ID: 0003_feed
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from eventstore.storage import postgres as pg_ddl
from eventstore.storage import sqlite as sqlite_ddl

revision = "0003_feed"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    name = _dialect()
    op.create_table(
        "feed_clock",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("xact", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_feed_clock"),
    )
    if name == "postgresql":
        op.add_column(
            "events",
            sa.Column("xact", sa.BigInteger(), server_default=sa.text(pg_ddl.FEED_XACT), nullable=True),
        )
        op.create_index("ix_events_xact_session_pk_version", "events", ["xact", "session_pk", "version"])
        for statement in pg_ddl.FEED_DDL_V3:
            op.execute(statement)
    else:
        op.add_column("events", sa.Column("xact", sa.BigInteger(), nullable=True))
        for statement in sqlite_ddl.feed_backfill_v3():
            op.execute(statement)
        op.create_index("ix_events_xact_session_pk_version", "events", ["xact", "session_pk", "version"])
        for statement in sqlite_ddl.FEED_DDL_V3:
            op.execute(statement)


def downgrade() -> None:
    name = _dialect()
    ddl = pg_ddl if name == "postgresql" else sqlite_ddl
    for statement in ddl.DROP_FEED_DDL_V3:
        op.execute(statement)
    op.drop_index("ix_events_xact_session_pk_version", table_name="events")
    op.drop_column("events", "xact")
    op.drop_table("feed_clock")


def _dialect() -> str:
    name = op.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
    return str(name)
