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


revision = "0003_feed"
down_revision = "0002"
branch_labels = None
depends_on = None

# -- the DDL this revision ran, frozen here: runtime modules hold none --------------

#: The default of ``events.xact`` (revision 0003): the writing transaction's id. It is the
#: key of the feed's visibility barrier: a transaction's id is assigned before it commits,
#: so rows below the oldest running transaction id are all committed and no row can ever
#: be added below it again.
PG_FEED_XACT = "(pg_current_xact_id()::text)::bigint"

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


# Revision 0001's UPDATE guard, dropped around the backfill and recreated as it was.
#: Triggers of revision 0001: no UPDATE ever; DELETE only under a compaction permit.
SQLITE_IMMUTABILITY = (
    """
    CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN
        SELECT RAISE(ABORT, 'events are immutable: UPDATE refused');
    END
    """,
    """
    CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    WHEN NOT EXISTS (
        SELECT 1 FROM compaction_permits p
        WHERE p.session_pk = OLD.session_pk AND OLD.version <= p.upto
    )
    BEGIN
        SELECT RAISE(ABORT, 'events are immutable: DELETE refused (only compaction may delete)');
    END
    """,
)

#: Revision 0003: a deleted event's feed number is remembered in ``feed_clock``, so that
#: the next insert (``max(events.xact, feed_clock.xact) + 1``) never hands it out again —
#: a consumer that stored it as its position would otherwise skip the new event.
SQLITE_FEED_CLOCK = (
    """
    CREATE TRIGGER events_feed_clock AFTER DELETE ON events
    BEGIN
        INSERT INTO feed_clock (id, xact) VALUES (1, coalesce(OLD.xact, 0))
        ON CONFLICT (id) DO UPDATE SET xact = max(xact, excluded.xact);
    END
    """,
)

SQLITE_DROP_FEED_CLOCK = ("DROP TRIGGER IF EXISTS events_feed_clock",)

def sqlite_feed_backfill() -> tuple[str, ...]:
    """Give the events recorded before revision 0003 their feed number: 0 for all (the
    feed orders them by session and version, before anything recorded later).

    The immutability trigger refuses every UPDATE of events, so it is dropped around the
    backfill and recreated as it was, inside the migration's transaction.
    """
    no_update = SQLITE_IMMUTABILITY[0]
    return (
        "DROP TRIGGER events_no_update",
        "UPDATE events SET xact = 0 WHERE xact IS NULL",
        no_update,
    )


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
            sa.Column("xact", sa.BigInteger(), server_default=sa.text(PG_FEED_XACT), nullable=True),
        )
        op.create_index("ix_events_xact_session_pk_version", "events", ["xact", "session_pk", "version"])
        for statement in PG_FEED_NOTIFY:
            op.execute(statement)
    else:
        op.add_column("events", sa.Column("xact", sa.BigInteger(), nullable=True))
        for statement in sqlite_feed_backfill():
            op.execute(statement)
        op.create_index("ix_events_xact_session_pk_version", "events", ["xact", "session_pk", "version"])
        for statement in SQLITE_FEED_CLOCK:
            op.execute(statement)


def downgrade() -> None:
    name = _dialect()
    for statement in PG_DROP_FEED_NOTIFY if name == "postgresql" else SQLITE_DROP_FEED_CLOCK:
        op.execute(statement)
    op.drop_index("ix_events_xact_session_pk_version", table_name="events")
    op.drop_column("events", "xact")
    op.drop_table("feed_clock")


def _dialect() -> str:
    name = op.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
    return str(name)
