"""The eventstore schema as SQLAlchemy Core tables on one :data:`metadata`.

This module is the declared truth that the Alembic revisions in ``migrations/`` must
reproduce (``tests/test_migrations.py`` compares them). It holds no statements and no
dialect-specific DDL: the immutability triggers live in the revisions and in
``sqlite.py`` / ``postgres/``.

Tables::

    sessions            one row per session (root or branch); the append lock and head cache,
                        the streaming turn's writer lease, closed sessions
    events              the immutable log, PK (session_pk, version) (SQLite: PK xact, the
                        rowid, and (session_pk, version) unique)
    snapshot_blobs      a chunk of encoded top-level messages per row, keyed by its digest (shared),
                        with how many snapshot references it has
    snapshots           a state every ``snapshot_every`` versions: status/error + message digests
    compaction_permits  a row exists only inside a compaction, erasure or sealing transaction
                        (lets DELETE through)
    compactions         one row per compaction: binds the baseline to the chain (state digest,
                        and the hashes of the versions it removed, for checkpoint checks)
    tombstones          one row per erased session: what was erased, when, by whom and why
    info_changes        one row per ``set_info``: who changed a session's title, owner or
                        metadata, when, and to what
    session_rewinds     one row per rewind: which row kept the old line under which id, the
                        row made for the session id, from which head to which version, who/why
    event_segments      sealed segments: a closed turn's events as one compressed body (the
                        rows it replaced are gone), with the hashes that check it
    sealed_event_ids    the event ids of sealed events, PK (session_pk, event_id): an append's
                        duplicate check probes it instead of decoding every segment
    feed_clock          SQLite only: the highest feed number ever deleted (never handed out again)

Integers and bytes only: timestamps are microseconds since the Unix epoch (UTC), so both
backends store them losslessly and identically; hashes and digests are raw bytes.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)

__all__ = [
    "NAMING_CONVENTION",
    "VERSION_TABLE",
    "metadata",
    "sessions",
    "events",
    "EVENT_COLUMNS",
    "snapshot_blobs",
    "snapshots",
    "compaction_permits",
    "compactions",
    "tombstones",
    "info_changes",
    "session_rewinds",
    "feed_clock",
    "event_segments",
    "sealed_event_ids",
    "SQLITE_FEED_KEY",
    "BRIN_PAGES_PER_RANGE",
    "POSTGRESQL_ONLY",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Alembic's version table, named so it never clashes with an application's own Alembic.
VERSION_TABLE = "eventstore_alembic_version"

metadata = MetaData(naming_convention=NAMING_CONVENTION)

sessions = Table(
    "sessions",
    metadata,
    # A surrogate integer key: every event row stores 4 bytes instead of the text id.
    Column("pk", Integer, primary_key=True, autoincrement=True),
    Column("id", Text, nullable=False, unique=True),
    Column("parent_pk", Integer, ForeignKey("sessions.pk"), nullable=True),
    Column("fork_version", Integer, nullable=True),
    Column("head", Integer, nullable=False),
    Column("head_hash", LargeBinary, nullable=False),
    Column("head_turn", Integer, nullable=False),
    # Compaction: versions below `baseline` are gone; the chain restarts from baseline_hash.
    Column("baseline", Integer, nullable=False, server_default=text("0")),
    Column("baseline_hash", LargeBinary, nullable=True),
    Column("baseline_turn", Integer, nullable=False, server_default=text("0")),
    Column("created_at", BigInteger, nullable=False),
    # Streaming turns: the token of the turn that owns the session's stream and when it
    # last flushed or renewed (microseconds), so that crash recovery can tell a dead
    # writer from a live one; and whether (and why) the session was closed to writes.
    Column("writer", Text, nullable=True),
    Column("writer_seen", BigInteger, nullable=True),
    Column("closed_at", BigInteger, nullable=True),
    Column("closed_reason", Text, nullable=True),
    # The catalogue (a chat app's sidebar): what set_info sets, and what every head move
    # keeps — the fold's status and first user text at the head, and the newest own
    # event's time — so that a page of sessions is one index scan, never a fold.
    Column("title", Text, nullable=True),
    Column("owner", Text, nullable=True),
    Column("metadata", Text, nullable=True),
    Column("first_text", Text, nullable=True),
    Column("status", Text, nullable=False, server_default=text("'idle'")),
    Column("updated_at", BigInteger, nullable=False, server_default=text("0")),
    # A line kept by a rewind: the pk of the session row the rewind created for the id
    # this line was rewound away from (NULL for every other session).
    Column("line_of", Integer, nullable=True),
)
# One index per listing order, with and without an owner: a page reads the first `limit`
# entries after its cursor. `recent` is newest first, ties by id ascending.
Index("ix_sessions_owner_recent", sessions.c.owner, sessions.c.updated_at.desc(), sessions.c.id)
Index("ix_sessions_recent", sessions.c.updated_at.desc(), sessions.c.id)
Index("ix_sessions_owner_created", sessions.c.owner, sessions.c.created_at, sessions.c.id)
Index("ix_sessions_created", sessions.c.created_at, sessions.c.id)

#: Table pages per summary of the events' BRIN index on ``xact`` (PostgreSQL).
BRIN_PAGES_PER_RANGE = 16

events = Table(
    "events",
    metadata,
    # No foreign key, on purpose: every event row is written by the statement (or the
    # transaction) that locks and moves its session's head, and sessions are never
    # deleted; a per-row RI check would cost ~15% of append throughput for nothing.
    Column("session_pk", Integer, nullable=False),
    Column("version", Integer, nullable=False),
    Column("event_id", Text, nullable=True),
    Column("type", Text, nullable=False),
    Column("turn", Integer, nullable=False),
    # Canonical orjson bytes of the validated action. Not jsonb: jsonb refuses \u0000 and
    # is larger; nothing queries inside a payload.
    Column("payload", LargeBinary, nullable=False),
    Column("recorded_at", BigInteger, nullable=False),
    Column("actor", Text, nullable=True),
    Column("metadata", LargeBinary, nullable=True),
    Column("hash", LargeBinary, nullable=False),
    # The feed's order is (xact, session_pk, version). PostgreSQL: the writing transaction's
    # id (never lower than the session's previous event's), a column default so that every
    # insert gets it; the feed reads only below the oldest transaction that can still write
    # an event. SQLite (one writer at a time): a number that grows in commit order, given by the insert — and
    # the table's rowid (see SQLITE_FEED_KEY).
    Column("xact", BigInteger().with_variant(Integer(), "sqlite"), nullable=True),
    # Provider-native data the reducer ignores (an item's exact JSON, token usage, a file
    # reference): JSON text stored byte for byte, hashed into the chain when present.
    Column("native", LargeBinary, nullable=True),
    PrimaryKeyConstraint("session_pk", "version"),
    # PostgreSQL only: a BRIN index (a few bytes per range of 16 pages, not an entry per
    # event): transaction ids grow with insertion order, so each range covers a narrow
    # band of them and the feed reads bounded bands (see eventstore/core/feed_rules.py).
    Index(
        "ix_events_xact",
        "xact",
        postgresql_using="brin",
        postgresql_with={"pages_per_range": str(BRIN_PAGES_PER_RANGE), "autosummarize": "on"},
    ).ddl_if(dialect="postgresql"),
    Index(
        "ix_events_session_pk_event_id",
        "session_pk",
        "event_id",
        unique=True,
        sqlite_where=text("event_id IS NOT NULL"),
        postgresql_where=text("event_id IS NOT NULL"),
    ),
)

#: The columns of ``events`` in the field order of :class:`eventstore.core.rows.EventRow`
#: (every reader of event rows selects these).
EVENT_COLUMNS = (
    events.c.session_pk,
    events.c.version,
    events.c.event_id,
    events.c.type,
    events.c.turn,
    events.c.payload,
    events.c.recorded_at,
    events.c.actor,
    events.c.metadata,
    events.c.hash,
    events.c.native,
)

snapshot_blobs = Table(
    "snapshot_blobs",
    metadata,
    Column("digest", LargeBinary, primary_key=True),
    Column("body", LargeBinary, nullable=False),
    # How many references the snapshots hold to this blob (a snapshot naming it twice
    # counts twice). Raised in the transaction that writes a snapshot, lowered in the one
    # that deletes it; a blob at 0 may be deleted. It may over-state (PostgreSQL's
    # one-statement appends do not release a snapshot they write over, which an append
    # beyond the head never meets), never under-state.
    Column("refs", Integer, nullable=False, server_default="0"),
)

snapshots = Table(
    "snapshots",
    metadata,
    Column("session_pk", Integer, ForeignKey("sessions.pk"), nullable=False),
    Column("version", Integer, nullable=False),
    Column("reducer_version", Integer, nullable=False),
    # Everything of the state except its messages (status, error), canonical JSON.
    Column("rest", LargeBinary, nullable=False),
    # The digests of the chunks of the state's top-level messages, concatenated in order.
    Column("message_digests", LargeBinary, nullable=False),
    PrimaryKeyConstraint("session_pk", "version"),
)

compaction_permits = Table(
    "compaction_permits",
    metadata,
    Column("session_pk", Integer, nullable=False),
    Column("upto", Integer, nullable=False),
    PrimaryKeyConstraint("session_pk"),
)

compactions = Table(
    "compactions",
    metadata,
    Column("session_pk", Integer, ForeignKey("sessions.pk"), nullable=False),
    # The new baseline: the version whose state the baseline snapshot holds.
    Column("upto", Integer, nullable=False),
    Column("previous_baseline", Integer, nullable=False),
    # The chain hash and turn at `upto` (the session row's baseline_hash/baseline_turn).
    Column("baseline_hash", LargeBinary, nullable=False),
    Column("baseline_turn", Integer, nullable=False),
    # The store's digest of the baseline state: a snapshot at `upto` that does not hash to
    # it was not written by this compaction (the app role may upsert snapshots).
    Column("state_digest", LargeBinary, nullable=False),
    # The chain hashes of the session's own versions first_version.. upto, concatenated
    # (32 bytes each): what a checkpoint anchored below the new baseline is checked against.
    Column("first_version", Integer, nullable=False),
    Column("removed_hashes", LargeBinary, nullable=False),
    Column("compacted_at", BigInteger, nullable=False),
    Column("actor", Text, nullable=True),
    PrimaryKeyConstraint("session_pk", "upto"),
)

tombstones = Table(
    "tombstones",
    metadata,
    # The id, not the pk: the session row is gone, and an erased id is never reused.
    Column("session_id", Text, primary_key=True),
    Column("head", Integer, nullable=False),
    Column("head_hash", LargeBinary, nullable=False),
    Column("erased_at", BigInteger, nullable=False),
    Column("actor", Text, nullable=True),
    Column("reason", Text, nullable=False),
    # The session whose erasure took this one with it (a branch of it); NULL for that one.
    Column("erased_with", Text, nullable=True),
)

info_changes = Table(
    "info_changes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_pk", Integer, nullable=False),
    Column("changed_at", BigInteger, nullable=False),
    Column("actor", Text, nullable=True),
    # Canonical JSON of the fields set and their new values.
    Column("changes", Text, nullable=False),
    Index("ix_info_changes_session_pk_id", "session_pk", "id"),
)


session_rewinds = Table(
    "session_rewinds",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    # The id that was rewound, and the id its old line is kept under (ids, not pks only:
    # they are what a checkpoint anchors and what a reader asks for).
    Column("session_id", Text, nullable=False),
    Column("kept_id", Text, nullable=False, unique=True),
    # The row that holds the old line's events (renamed to kept_id) and the row made for
    # session_id, a branch of it at to_version. No foreign keys: erasure deletes the rows
    # and the record stays, as tombstones do.
    Column("kept_pk", Integer, nullable=False, unique=True),
    Column("new_pk", Integer, nullable=False, unique=True),
    Column("from_head", Integer, nullable=False),
    Column("from_hash", LargeBinary, nullable=False),
    Column("to_version", Integer, nullable=False),
    Column("rewound_at", BigInteger, nullable=False),
    Column("actor", Text, nullable=True),
    Column("reason", Text, nullable=True),
    Index("ix_session_rewinds_session_id", "session_id"),
)

#: SQLite's events table differs from the declaration above in one point: its primary key
#: is ``xact`` (an INTEGER PRIMARY KEY, the rowid: the feed reads the table's own B-tree
#: in order, with no index of its own), and ``(session_pk, version)`` is this unique
#: constraint instead (see revision 0005). PostgreSQL has no such constraint and no index
#: on ``xact`` for SQLite: the names the schema comparison skips per dialect.
SQLITE_FEED_KEY = "uq_events_session_pk_version"
POSTGRESQL_ONLY = frozenset({"ix_events_xact"})

feed_clock = Table(
    "feed_clock",
    metadata,
    # One row (id 1), SQLite only: the highest `events.xact` a compaction or an erasure
    # deleted, so that a later insert never reuses it (PostgreSQL's xact never repeats).
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("xact", BigInteger, nullable=False),
)


event_segments = Table(
    "event_segments",
    metadata,
    # The rows first_version..last_version of one session: whole turns, all closed (one
    # turn, or a few consecutive small ones).
    Column("session_pk", Integer, nullable=False),
    Column("first_version", Integer, nullable=False),
    Column("last_version", Integer, nullable=False),
    Column("first_turn", Integer, nullable=False),
    Column("last_turn", Integer, nullable=False),
    # The feed numbers' range: the feed reads the segments whose range meets its band.
    Column("min_xact", BigInteger, nullable=False),
    Column("max_xact", BigInteger, nullable=False),
    # The chain hash before the first event (checked through end_hash), the last event's
    # hash and a digest of the events' feed numbers in version order: PostgreSQL's sealing
    # function copies and computes these two from the rows, never from the caller.
    Column("prev_hash", LargeBinary, nullable=False),
    Column("end_hash", LargeBinary, nullable=False),
    Column("xact_digest", LargeBinary, nullable=False),
    # The events, columnar and compressed (eventstore/core/segments.py); no hashes.
    Column("body", LargeBinary, nullable=False),
    PrimaryKeyConstraint("session_pk", "first_version"),
    Index("ix_event_segments_max_xact", "max_xact"),
)


sealed_event_ids = Table(
    "sealed_event_ids",
    metadata,
    # One row per sealed event that has an id, written with its segment and deleted with
    # it: a sealed id is not in the events table's unique index, and an idempotent append
    # finds it here with one index probe, then decodes only the segment holding it.
    # PostgreSQL's sealing function writes these from the rows it deletes.
    Column("session_pk", Integer, nullable=False),
    Column("event_id", Text, nullable=False),
    Column("version", Integer, nullable=False),
    PrimaryKeyConstraint("session_pk", "event_id"),
)
