"""Feed storage without a B-tree entry per event.

PostgreSQL: the index on ``(xact, session_pk, version)`` (an entry of ~28 bytes per event)
becomes a BRIN index on ``xact`` (a summary per range of 16 pages): transaction ids grow
with insertion order, so each range covers a narrow band of them, and the feed reads
bounded bands of ``xact`` and sorts each in memory. Nothing is renumbered.

SQLite: ``xact`` becomes the events table's INTEGER PRIMARY KEY (its rowid), so the feed
number needs neither a column nor an index of its own and the feed is a rowid range scan;
``(session_pk, version)`` stays unique. The table is rebuilt (see
:func:`eventstore.storage.sqlite.feed_rowid_v5`).

Revision ID: 0005_feed_storage
Revises: 0004_turn_leases
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

from eventstore.storage import sqlite as sqlite_ddl

revision = "0005_feed_storage"
down_revision = "0004_turn_leases"
branch_labels = None
depends_on = None

_BRIN = {"postgresql_using": "brin", "postgresql_with": {"pages_per_range": "16", "autosummarize": "on"}}


def upgrade() -> None:
    if _dialect() == "postgresql":
        op.drop_index("ix_events_xact_session_pk_version", table_name="events")
        op.create_index("ix_events_xact", "events", ["xact"], **_BRIN)
    else:
        for statement in sqlite_ddl.feed_rowid_v5(upgrade=True):
            op.execute(statement)


def downgrade() -> None:
    if _dialect() == "postgresql":
        op.drop_index("ix_events_xact", table_name="events")
        op.create_index("ix_events_xact_session_pk_version", "events", ["xact", "session_pk", "version"])
    else:
        for statement in sqlite_ddl.feed_rowid_v5(upgrade=False):
            op.execute(statement)


def _dialect() -> str:
    name = op.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
    return str(name)
