"""Wake-ups sent after the commit: the events table's notification trigger goes.

PostgreSQL: the statement-level trigger of revision 0003 made every writing transaction
issue ``NOTIFY``, and PostgreSQL commits such transactions one at a time (a database-wide
lock held through the commit and its WAL flush), so concurrent writers stopped sharing
WAL flushes. The store now sends the notification itself, once its writes have committed,
from a connection of its own (see ``eventstore/storage/watch.py``).

SQLite: nothing changes (followers watch the database file).

Revision ID: 0006_notify_after_commit
Revises: 0005_feed_storage
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

from eventstore.storage import postgres as pg_ddl

revision = "0006_notify_after_commit"
down_revision = "0005_feed_storage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if _dialect() == "postgresql":
        for statement in pg_ddl.DROP_FEED_DDL_V3:
            op.execute(statement)


def downgrade() -> None:
    if _dialect() == "postgresql":
        for statement in pg_ddl.FEED_DDL_V3:
            op.execute(statement)


def _dialect() -> str:
    name = op.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
    return str(name)
