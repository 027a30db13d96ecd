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


revision = "0005_feed_storage"
down_revision = "0004_turn_leases"
branch_labels = None
depends_on = None

# -- the DDL this revision ran, frozen here: runtime modules hold none --------------

# The triggers of revisions 0001-0003, dropped and recreated around the table's rebuild.
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

SQLITE_DROP_IMMUTABILITY = (
    "DROP TRIGGER IF EXISTS events_no_delete",
    "DROP TRIGGER IF EXISTS events_no_update",
)

#: Messages of revision 0002's insert triggers (the error classifier matches on them).
_VERSION_RECORDED = "events are immutable: this version is already recorded"

_EVENT_ID_RECORDED = "events are immutable: this event id is already recorded"

def sqlite_audit(schema: str) -> tuple[str, ...]:
    """Triggers of revision 0002: an INSERT never replaces a recorded event.

    ``INSERT OR REPLACE`` / ``REPLACE INTO`` resolve a key conflict by deleting the old
    row, and SQLite fires DELETE triggers for that only with ``recursive_triggers`` on.
    So the insert itself is refused when its version or its event id is recorded already
    (two index probes the unique checks make anyway). An ordinary duplicate insert now
    fails here too, with a message the error classifier maps as before.

    ``schema`` is unused: a trigger of the main database resolves the tables it names in
    the main database only, so a TEMP table cannot shadow ``compaction_permits`` (a
    trigger naming a temp object fails to compile).
    """
    del schema
    return (
        f"""
        CREATE TRIGGER events_no_replace_version BEFORE INSERT ON events
        WHEN EXISTS (
            SELECT 1 FROM events e WHERE e.session_pk = NEW.session_pk AND e.version = NEW.version
        )
        BEGIN
            SELECT RAISE(ABORT, '{_VERSION_RECORDED}');
        END
        """,
        f"""
        CREATE TRIGGER events_no_replace_event_id BEFORE INSERT ON events
        WHEN NEW.event_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM events e
            WHERE e.session_pk = NEW.session_pk AND e.event_id = NEW.event_id
        )
        BEGIN
            SELECT RAISE(ABORT, '{_EVENT_ID_RECORDED}');
        END
        """,
    )

SQLITE_DROP_AUDIT = (
    "DROP TRIGGER IF EXISTS events_no_replace_event_id",
    "DROP TRIGGER IF EXISTS events_no_replace_version",
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


#: Revision 0005: the feed number is the rowid, and ``INSERT OR REPLACE`` resolves a rowid
#: conflict by deleting the row that holds it (no DELETE trigger fires for that): so an
#: insert naming a recorded number is refused too, like a recorded version or event id.
SQLITE_NO_REPLACE_XACT = (
    """
    CREATE TRIGGER events_no_replace_xact BEFORE INSERT ON events
    WHEN NEW.xact IS NOT NULL AND EXISTS (SELECT 1 FROM events e WHERE e.xact = NEW.xact)
    BEGIN
        SELECT RAISE(ABORT, 'events are immutable: this feed number is already recorded');
    END
    """,
)

_EVENT_COLUMNS = (
    "session_pk INTEGER NOT NULL, version INTEGER NOT NULL, event_id TEXT, type TEXT NOT NULL, "
    "turn INTEGER NOT NULL, payload BLOB NOT NULL, recorded_at BIGINT NOT NULL, actor TEXT, "
    "metadata BLOB, hash BLOB NOT NULL"
)

_EVENT_NAMES = "session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash"

def sqlite_feed_rowid(upgrade: bool) -> tuple[str, ...]:
    """Revision 0005: the feed number becomes the events table's rowid (or, downgrading,
    an indexed column again).

    ``xact INTEGER PRIMARY KEY`` makes the number the key of the table's own B-tree: no
    column and no index of its own, the feed a rowid range scan, and the number stable
    (an explicit INTEGER PRIMARY KEY survives ``VACUUM``; a plain rowid may not). The
    session key ``(session_pk, version)`` becomes a unique constraint, the index it had.

    SQLite cannot change a primary key in place, so the table is rebuilt: copied into a
    new one, the old one dropped, the new one renamed, its index and triggers recreated
    (and :data:`SQLITE_NO_REPLACE_XACT`'s guard of the numbers added).
    Numbers are kept, except that the events recorded before revision 0003 (all numbered
    0) get 1..n in session order and the others move up by n, so that every number is
    unique and the feed's order is unchanged (positions handed out before move only
    back: resuming from one can repeat events, never skip one).
    """
    if upgrade:
        table = (
            f"CREATE TABLE events_v5 ({_EVENT_COLUMNS}, xact INTEGER, "
            "CONSTRAINT pk_events PRIMARY KEY (xact), "
            "CONSTRAINT uq_events_session_pk_version UNIQUE (session_pk, version))"
        )
        unnumbered = "(SELECT count(*) FROM events WHERE coalesce(xact, 0) = 0)"
        number = (
            f"CASE WHEN coalesce(xact, 0) > 0 THEN xact + {unnumbered} "
            "ELSE row_number() OVER (PARTITION BY coalesce(xact, 0) > 0 ORDER BY session_pk, version) END"
        )
        renumber_clock: tuple[str, ...] = (f"UPDATE feed_clock SET xact = xact + {unnumbered}",)
        index: tuple[str, ...] = SQLITE_NO_REPLACE_XACT
    else:
        table = (
            f"CREATE TABLE events_v5 ({_EVENT_COLUMNS}, xact BIGINT, "
            "CONSTRAINT pk_events PRIMARY KEY (session_pk, version))"
        )
        number, renumber_clock = "xact", ()
        index = (
            "CREATE INDEX ix_events_xact_session_pk_version ON events (xact, session_pk, version)",
        )
    return (
        *SQLITE_DROP_FEED_CLOCK,
        *SQLITE_DROP_AUDIT,
        *SQLITE_DROP_IMMUTABILITY,
        *renumber_clock,
        table,
        f"INSERT INTO events_v5 ({_EVENT_NAMES}, xact) SELECT {_EVENT_NAMES}, {number} FROM events",
        "DROP TABLE events",
        "ALTER TABLE events_v5 RENAME TO events",
        "CREATE UNIQUE INDEX ix_events_session_pk_event_id ON events (session_pk, event_id) "
        "WHERE event_id IS NOT NULL",
        *index,
        *SQLITE_IMMUTABILITY,
        *sqlite_audit("main"),
        *SQLITE_FEED_CLOCK,
    )

_BRIN = {"postgresql_using": "brin", "postgresql_with": {"pages_per_range": "16", "autosummarize": "on"}}


def upgrade() -> None:
    if _dialect() == "postgresql":
        op.drop_index("ix_events_xact_session_pk_version", table_name="events")
        op.create_index("ix_events_xact", "events", ["xact"], **_BRIN)
    else:
        for statement in sqlite_feed_rowid(upgrade=True):
            op.execute(statement)


def downgrade() -> None:
    if _dialect() == "postgresql":
        op.drop_index("ix_events_xact", table_name="events")
        op.create_index("ix_events_xact_session_pk_version", "events", ["xact", "session_pk", "version"])
    else:
        for statement in sqlite_feed_rowid(upgrade=False):
            op.execute(statement)


def _dialect() -> str:
    name = op.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
    return str(name)
