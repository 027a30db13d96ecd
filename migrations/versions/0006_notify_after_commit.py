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


revision = "0006_notify_after_commit"
down_revision = "0005_feed_storage"
branch_labels = None
depends_on = None

# -- the DDL this revision ran, frozen here: runtime modules hold none --------------

# Revision 0003's notification trigger: dropped here, recreated by a downgrade.
#: Revision 0003: one coalesced wake-up per writing transaction. A statement-level trigger
#: notifies once per INSERT statement, and PostgreSQL folds identical notifications of one
#: transaction into one, delivered at commit. The channel names the events table by its
#: OID, so stores on different schemas of one server wake only their own followers.
#: Revision 0006 drops it again (see :class:`_NotifySignal`).
PG_FEED_NOTIFY = (
    """
    CREATE FUNCTION eventstore_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('eventstore_' || TG_RELID::text, '');
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER events_notify AFTER INSERT ON events
    FOR EACH STATEMENT EXECUTE FUNCTION eventstore_events_notify()
    """,
)

PG_DROP_FEED_NOTIFY = (
    "DROP TRIGGER IF EXISTS events_notify ON events",
    "DROP FUNCTION IF EXISTS eventstore_events_notify()",
)


def upgrade() -> None:
    if _dialect() == "postgresql":
        for statement in PG_DROP_FEED_NOTIFY:
            op.execute(statement)


def downgrade() -> None:
    if _dialect() == "postgresql":
        for statement in PG_FEED_NOTIFY:
            op.execute(statement)


def _dialect() -> str:
    name = op.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
    return str(name)
