"""PostgreSQL via psycopg 3: row locks per session, upserts, plpgsql immutability triggers.

This is the only module that imports psycopg.
"""

from __future__ import annotations

import asyncio
import logging
import re
import select as _select
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg import sql as pgsql
from sqlalchemy import (
    Connection,
    bindparam,
    create_engine,
    event,
    exists,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.util import await_

from eventstore.core.rows import (
    DIGEST_SIZE,
    Band,
    CatalogueEffect,
    EventRow,
    FeedBarrier,
    LoadParts,
    NewSession,
    SealableTurn,
    SealedEvent,
    SessionRow,
    SnapshotRow,
    TurnBatch,
)
from eventstore.errors import SchemaError, StorageError
from eventstore.storage.catalogue import PG_CATALOGUE_SET, effect_params
from eventstore.storage.interface import Tx
from eventstore.storage.pg_barrier import writers_barrier
from eventstore.storage.schema import BRIN_PAGES_PER_RANGE, events
from eventstore.storage.sql import Compiled, ErrorKind, SqlStorage, session_row
from eventstore.storage.watch import AsyncProbe, Probe, Signal

_log = logging.getLogger(__name__)

__all__ = [
    "PostgresStorage",
    "FEED_XACT",
    "feed_channel",
    "PARTITION_SETTING",
    "MAX_PARTITIONS",
]

# A session row, or maybe none (what _learn_key passes through).
_Row = TypeVar("_Row", SessionRow, SessionRow | None)

# pg_advisory_xact_lock key for migrations: crc32(b"eventstore-migrate").
_MIGRATION_LOCK = 0x4E5F_7A31


#: The default of ``events.xact`` (revision 0003): the writing transaction's id. It is the
#: key of the feed's visibility barrier: a transaction's id is assigned before it commits,
#: so rows below the oldest transaction that can still write one are all committed and no
#: row can ever be added below it again.
FEED_XACT = "(pg_current_xact_id()::text)::bigint"


#: The channel followers listen on, for the events table the search path finds: it names
#: the table by its OID, so stores on different schemas of one server wake only their own.
_FEED_CHANNEL = "SELECT 'eventstore_' || to_regclass('events')::oid::text"


def feed_channel() -> str:
    """The statement that names the notification channel of this schema's events table."""
    return _FEED_CHANNEL


#: The server setting that asks `migrate` for session-partitioned tables when the
#: `partitions` option is not given (``ALTER DATABASE db SET eventstore.partitions = 16``,
#: or ``options=-c eventstore.partitions=16`` in the URL).
PARTITION_SETTING = "eventstore.partitions"
#: The most hash partitions `migrate` creates (each one costs planning time).
MAX_PARTITIONS = 1024

# Whether the `events` table on the search path is partitioned, and into how many parts.
_PARTITION_STATE = text(
    "SELECT c.relkind = 'p', (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid) "
    "FROM pg_class c WHERE c.oid = to_regclass('events')"
)


# A partition's copies of the events' keys get names of PostgreSQL's choosing.
_PARTITION_PK = re.compile(r"events_p\d+_pkey")
_PARTITION_EVENT_ID = re.compile(r"events_p\d+_session_pk_event_id_idx")


def _partition_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StorageError(f"{where} must be a whole number of partitions, not {value!r}")
    if not 0 <= value <= MAX_PARTITIONS:
        raise StorageError(f"{where} must be between 0 and {MAX_PARTITIONS}, not {value}")
    return value


def _partition_setting(value: str | None) -> int:
    """The server's ``eventstore.partitions`` (unset or empty: 0)."""
    text_value = (value or "").strip()
    if not text_value:
        return 0
    if not text_value.isdigit():
        raise StorageError(
            f"{PARTITION_SETTING} must be a whole number of partitions, not {text_value!r}"
        )
    return _partition_count(int(text_value), PARTITION_SETTING)


# The session key of a hot statement, for its scans of `events` and `snapshots`: on
# partitioned tables a key known when the execution starts lets the executor prune the
# other partitions then, where a key read from another row of the statement leaves the
# cached generic plan to set up a scan of every partition and choose at run time. It is
# the parameter plus a zero the planner cannot fold (now() is STABLE) on purpose: a bare
# parameter is pruned on at plan time in each custom plan, which then looks far cheaper
# than the generic one, and PostgreSQL re-plans the statement on every execution (slower
# than the run-time pruning it replaces); a stable expression is pruned on only at
# executor start-up, both plans cost the same, and the cached generic plan is used.
_KEY_PARAM = "(%(pk)s::int + (now() IS NULL)::int)"

# One statement, one round trip, its own transaction (run in autocommit): move the head
# only if it is still what the writer saw (the version check built in; the UPDATE takes
# the session's row lock), insert the batch from arrays, and store the snapshots the batch
# reaches with the message blobs they add. Each event's feed number is the transaction's
# id, raised to the session's previous event's (see eventstore/core/feed_rules.py). Every insert
# selects FROM moved, so nothing at all is written when the head had moved on. Arrays and bytes are sent in binary (%b):
# psycopg's text quoting of a hundred bytea elements costs milliseconds.
_APPEND_FAST = """
WITH moved AS (
    UPDATE sessions SET head = %(head)s, head_hash = %(hash)b, head_turn = %(turn)s,
        {CATALOGUE}
    WHERE pk = %(pk)s AND head = %(old_head)s AND head_hash = %(old_hash)b AND closed_at IS NULL
    RETURNING pk
), ins AS (
    INSERT INTO events
        (session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash,
         xact)
    SELECT moved.pk, u.version, u.event_id, u.type, u.turn, u.payload,
           %(recorded_at)s::bigint, %(actor)s::text, %(metadata)b::bytea, u.hash,
           greatest({FEED_XACT}, (SELECT p.xact FROM events p
                                   WHERE p.session_pk = {KEY} AND p.version = %(old_head)s))
    FROM moved, unnest(%(versions)b::int[], %(event_ids)b::text[], %(types)b::text[],
                       %(turns)b::int[], %(payloads)b::bytea[], %(hashes)b::bytea[])
         AS u(version, event_id, type, turn, payload, hash)
    RETURNING 1
), blobs AS (
    INSERT INTO snapshot_blobs (digest, body)
    SELECT b.digest, b.body
    FROM moved, unnest(%(digests)b::bytea[], %(bodies)b::bytea[]) AS b(digest, body)
    ON CONFLICT DO NOTHING
), snaps AS (
    INSERT INTO snapshots (session_pk, version, reducer_version, rest, message_digests)
    SELECT moved.pk, n.version, n.reducer_version, n.rest, n.message_digests
    FROM moved, unnest(%(s_versions)b::int[], %(s_reducers)b::int[], %(s_rests)b::bytea[],
                       %(s_digests)b::bytea[]) AS n(version, reducer_version, rest, message_digests)
    ON CONFLICT (session_pk, version) DO UPDATE SET
        reducer_version = excluded.reducer_version,
        rest = excluded.rest,
        message_digests = excluded.message_digests
)
SELECT count(*) FROM ins
""".replace("{FEED_XACT}", FEED_XACT).replace("{KEY}", _KEY_PARAM).replace("{CATALOGUE}", PG_CATALOGUE_SET)

# The same without the snapshot parts, for the (most frequent) batches that reach none.
_APPEND_FAST_NO_SNAPSHOT = (
    _APPEND_FAST[: _APPEND_FAST.index("), blobs AS (")]
    + """
)
SELECT count(*) FROM ins
"""
)

# A one-event batch without snapshots (most appends of a streamed reply): the same head
# check and insert with scalar parameters. Array parameters cost the client ~0.1 ms per
# statement to adapt (psycopg inspects every list), more than the insert itself.
_APPEND_ONE = """
WITH moved AS (
    UPDATE sessions SET head = %(head)s::int, head_hash = %(hash)b, head_turn = %(turn)s::int,
        {CATALOGUE}
    WHERE pk = %(pk)s::int AND head = %(old_head)s::int AND head_hash = %(old_hash)b
          AND closed_at IS NULL
    RETURNING pk
)
INSERT INTO events
    (session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash, xact)
SELECT moved.pk, %(head)s::int, %(event_id)s::text, %(type)s::text, %(turn)s::int,
       %(payload)b, %(recorded_at)s::bigint, %(actor)s::text, %(metadata)b::bytea, %(hash)b,
       greatest({FEED_XACT}, (SELECT p.xact FROM events p
                               WHERE p.session_pk = {KEY} AND p.version = %(old_head)s::int))
FROM moved
""".replace("{FEED_XACT}", FEED_XACT).replace("{KEY}", _KEY_PARAM).replace("{CATALOGUE}", PG_CATALOGUE_SET)

# A group commit of streaming turns in one statement, one round trip, its own transaction:
# move each session's head only if it is still what its turn saw, the turn still holds the
# lease and the session is open (renewing or giving up the lease), then insert the events
# and snapshots of the sessions that moved. Returns the pks that moved. A batch without a
# writer is a plain append (the async store's group commit): the lease is left alone.
_APPEND_BATCHES = """
WITH b AS (
    SELECT * FROM unnest(%(pks)b::int[], %(old_heads)b::int[], %(old_hashes)b::bytea[],
                         %(writers)b::text[], %(heads)b::int[], %(hashes)b::bytea[],
                         %(turns)b::int[], %(releases)b::bool[], %(claims)b::bool[],
                         %(c_updated)b::bigint[], %(c_st_u)b::text[], %(c_st_n)b::text[],
                         %(c_reset)b::int[], %(c_text)b::text[])
        AS b(pk, old_head, old_hash, writer, head, hash, turn, release, claim,
             c_updated, c_st_u, c_st_n, c_reset, c_text)
), moved AS (
    UPDATE sessions s SET head = b.head, head_hash = b.hash, head_turn = b.turn,
        updated_at = coalesce(b.c_updated, s.updated_at),
        status = CASE WHEN s.first_text IS NOT NULL THEN coalesce(b.c_st_u, s.status)
                      ELSE coalesce(b.c_st_n, s.status) END,
        first_text = CASE WHEN b.c_reset = 1 THEN b.c_text ELSE coalesce(s.first_text, b.c_text) END,
        writer = CASE WHEN b.writer IS NULL THEN s.writer WHEN b.release THEN NULL ELSE b.writer END,
        writer_seen = CASE WHEN b.writer IS NULL THEN s.writer_seen
                           WHEN b.release THEN NULL ELSE %(seen)s::bigint END
    FROM b
    WHERE s.pk = b.pk AND s.head = b.old_head AND s.head_hash = b.old_hash
      AND (CASE WHEN b.writer IS NULL THEN true
                WHEN b.claim THEN s.writer IS NULL ELSE s.writer = b.writer END)
      AND s.closed_at IS NULL
    RETURNING s.pk
), ins AS (
    INSERT INTO events
        (session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash,
         xact, native)
    SELECT u.pk, u.version, u.event_id, u.type, u.turn, u.payload, u.recorded_at, u.actor,
           u.metadata, u.hash,
           greatest({FEED_XACT}, (SELECT p.xact FROM events p
                                   WHERE p.session_pk = u.pk AND p.version = b.old_head)),
           u.native
    FROM unnest(%(e_pks)b::int[], %(e_versions)b::int[], %(e_ids)b::text[], %(e_types)b::text[],
                %(e_turns)b::int[], %(e_payloads)b::bytea[], %(e_times)b::bigint[],
                %(e_actors)b::text[], %(e_metas)b::bytea[], %(e_hashes)b::bytea[],
                %(e_natives)b::bytea[])
         AS u(pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash,
              native)
    JOIN b ON b.pk = u.pk
    WHERE u.pk IN (SELECT pk FROM moved)
), blobs AS (
    INSERT INTO snapshot_blobs (digest, body)
    SELECT n.digest, n.body
    FROM unnest(%(b_pks)b::int[], %(b_digests)b::bytea[], %(b_bodies)b::bytea[])
         AS n(pk, digest, body)
    WHERE n.pk IN (SELECT pk FROM moved)
    ON CONFLICT DO NOTHING
), snaps AS (
    INSERT INTO snapshots (session_pk, version, reducer_version, rest, message_digests)
    SELECT n.pk, n.version, n.reducer_version, n.rest, n.message_digests
    FROM unnest(%(s_pks)b::int[], %(s_versions)b::int[], %(s_reducers)b::int[],
                %(s_rests)b::bytea[], %(s_digests)b::bytea[])
         AS n(pk, version, reducer_version, rest, message_digests)
    WHERE n.pk IN (SELECT pk FROM moved)
    ON CONFLICT (session_pk, version) DO UPDATE SET
        reducer_version = excluded.reducer_version,
        rest = excluded.rest,
        message_digests = excluded.message_digests
)
SELECT coalesce(array_agg(pk), '{}') FROM moved
""".replace("{FEED_XACT}", FEED_XACT)



def _effect_arrays(batches: Sequence[TurnBatch]) -> dict[str, list[Any]]:
    """The catalogue effects of a group commit, one array element per batch."""
    per = [effect_params(b.effect) for b in batches]
    return {k: [p[k] for p in per] for k in ("c_updated", "c_st_u", "c_st_n", "c_reset", "c_text")}


_RETRYABLE = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.AdminShutdown,
    psycopg.errors.CannotConnectNow,
    psycopg.OperationalError,
)


_CHECKED_IN = "eventstore_checked_in"
_IDLE = psycopg.pq.TransactionStatus.IDLE


def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
    if record is not None:
        record.info[_CHECKED_IN] = time.monotonic()


def _readable(dbapi_conn: Any) -> bool:
    """Whether an idle connection's socket has input (EOF or an unsolicited message)."""
    try:
        r, _, _ = _select.select([dbapi_conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(r)


# libpq reports these at connect time as a plain OperationalError (often without a
# SQLSTATE), so they are recognised by SQLSTATE class 28 / 3D000 or by libpq's wording.
_CONFIG_ERRORS = (
    "password authentication failed",
    "no password supplied",
    "authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    # a malformed connection parameter of the URL (?sslmode=bogus, a port out of range)
    "invalid connection option",
    "invalid port number",
    "invalid integer value",
    "bad value for",
)
_INVALID_VALUE = re.compile(r"invalid \w+ value")


def _is_config_error(exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate.startswith("28") or sqlstate == "3D000":
        return True
    text = str(exc)
    return any(phrase in text for phrase in _CONFIG_ERRORS) or bool(_INVALID_VALUE.search(text))


def _snapshot_xmin() -> Any:
    """The oldest transaction that can still write an event, in the statement's snapshot:
    every row below it is committed for good, and no row can be added below it any more.
    Not the cluster's oldest transaction: a stranger's must not hold the feed (see
    :mod:`eventstore.storage.pg_barrier`)."""
    return writers_barrier()


#: A band is always an index range, but the planner knows it only from statistics: on a
#: table not analysed yet it would read the whole table for every page.
_BAND_SETTINGS = "SET LOCAL enable_seqscan = off"


class _UnseenSessions(Exception):
    """A band holds events of sessions whose ids this storage has not learnt yet."""


def _unseen_sessions(pks: list[int]) -> list[Any]:
    raise _UnseenSessions


def _feed_barrier() -> Any:
    """The barrier, and whether committed rows wait at or above it — in one snapshot."""
    b = select(_snapshot_xmin().label("x")).subquery("b")
    return select(b.c.x, exists().where(events.c.xact >= b.c.x))


def _dedicated(engine: Any, **settings: str) -> tuple[Any, str]:
    """A connection of its own (outside the pool, in autocommit) and this schema's
    notification channel."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    params = {"connect_timeout": 5, **cparams, "autocommit": True}
    conn = psycopg.connect(*cargs, **params)
    try:
        for name, value in settings.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        channel = conn.execute(feed_channel()).fetchone()
        if channel is None or channel[0] is None:
            raise RuntimeError("no events table: the database is not migrated")
    except BaseException:
        conn.close()
        raise
    return conn, str(channel[0])


class _ListenProbe(Probe):
    """LISTEN on a dedicated connection (outside the pool) for the events table's channel."""

    def __init__(self, engine: Any) -> None:
        self._db = engine

    def connect(self) -> Any:
        conn, channel = _dedicated(self._db)
        try:
            conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
        except BaseException:
            conn.close()
            raise
        return conn

    def changed(self, handle: Any, timeout: float, stop: Any) -> bool:
        for _ in handle.notifies(timeout=timeout, stop_after=1):
            return True
        return False

    def close(self, handle: Any) -> None:
        try:
            handle.close()
        except Exception:  # noqa: BLE001 - a dead connection is closed anyway
            pass


#: The feed's BRIN index is summarized by the writers' notifier at most this often (s).
SUMMARIZE_EVERY = 1.0
#: Ranges summarized by one statement at most (a restarted store starts from the first).
SUMMARIZE_RANGES = 4096

# Summarizes the complete ranges of every BRIN index on the events table (or on its
# partitions) from where this store got to, leaving the newest range (and one more:
# concurrent writers fill their own pages) to inserts. Its lock conflicts with VACUUM's
# and with itself: one store at a time summarizes (the others skip at once, returning no
# rows), and rather than wait for a VACUUM it gives up and tries again later. {done}:
# (index, start) rows; it returns each index's next start.
_SUMMARIZE = f"""
SET LOCAL lock_timeout = '50ms';
WITH done(idx, start) AS (VALUES (0::oid, 0::bigint){{done}}),
mine AS (
    SELECT pg_try_advisory_xact_lock(
        hashtextextended('eventstore summarize ' || 'events'::regclass::oid::text, 0)) AS ok
),
ix AS (
    SELECT i.indexrelid AS idx,
           pg_relation_size(i.indrelid) / current_setting('block_size')::bigint AS pages
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_am a ON a.oid = c.relam
    WHERE (SELECT ok FROM mine) AND a.amname = 'brin' AND (
        i.indrelid = 'events'::regclass
        OR i.indrelid IN (SELECT relid FROM pg_partition_tree('events') WHERE isleaf))
),
todo AS (
    SELECT ix.idx,
           CASE WHEN coalesce(d.start, 0) > ix.pages THEN 0 ELSE coalesce(d.start, 0) END AS start,
           ix.pages - 2 * {BRIN_PAGES_PER_RANGE} AS last
    FROM ix LEFT JOIN done d ON d.idx = ix.idx
),
span AS (
    SELECT idx, start, least(last, start + {BRIN_PAGES_PER_RANGE * (SUMMARIZE_RANGES - 1)}) AS stop
    FROM todo
)
SELECT idx::bigint,
       CASE WHEN stop < start THEN start
            ELSE start + ((stop - start) / {BRIN_PAGES_PER_RANGE} + 1) * {BRIN_PAGES_PER_RANGE} END,
       (SELECT count(*) FROM generate_series(start, stop, {BRIN_PAGES_PER_RANGE}) b
        WHERE brin_summarize_range(idx::regclass, b) > 0)
FROM span
"""


class _NotifySignal(Signal):
    """``pg_notify`` on the events table's channel, sent after the writes committed.

    Each sign is its own tiny transaction on a dedicated connection. PostgreSQL holds a
    database-wide lock from a notifying transaction's pre-commit through its commit; the
    writers' transactions never notify, so they keep sharing WAL flushes, and only this
    one statement waits for that lock. It commits asynchronously (a notification is only
    a hint; losing one in a crash loses nothing), so it holds the lock for no WAL flush.
    The statement goes through libpq's asynchronous calls: sending it does not wait for
    the server, and it is never prepared (PgBouncer's transaction mode would hand a
    prepared statement to another backend).
    """

    def __init__(self, engine: Any) -> None:
        self._db = engine
        # BRIN index -> the first table page not summarized yet by this store
        self._summarized: dict[int, int] = {}
        self._summarize_at = 0.0  # monotonic
        self._cannot_summarize = False
        #: ranges this store summarized (for tests and benchmarks)
        self.summarized = 0

    def connect(self) -> Any:
        conn, channel = _dedicated(self._db, synchronous_commit="off")
        return conn, [channel.encode()]

    def summarize_feed_index(self, handle: Any, *, final: bool) -> None:
        """Summarize the feed index's newly complete ranges: at most once a second while
        commits come, and once when they stop.

        A band reads every range not summarized yet (a BRIN index cannot tell what such a
        range holds), and autovacuum summarizes them only on its own schedule (a minute
        apart by default): a busy table would make every follower read the last minute of
        writes again on each wake-up.
        """
        now = time.monotonic()
        if self._cannot_summarize or (now < self._summarize_at and not final):
            return
        self._summarize_at = now + SUMMARIZE_EVERY
        done = "".join(f", ({int(i)}::oid, {int(b)}::bigint)" for i, b in self._summarized.items())
        try:
            cur = handle[0].execute(_SUMMARIZE.format(done=done))
            while cur.description is None and cur.nextset():
                pass
            rows = cur.fetchall()
        except psycopg.errors.LockNotAvailable:
            return  # VACUUM holds the table: next time
        except psycopg.OperationalError:
            raise  # the connection: the notifier reconnects
        except psycopg.Error:
            # Not the table's owner (or no BRIN support): autovacuum's summaries will do.
            self._cannot_summarize = True
            return
        if rows:  # none: another store is summarizing
            self._summarized = {int(i): int(start) for i, start, _ in rows}
            self.summarized += sum(int(n) for _, _, n in rows)
        else:
            # Said on the log, so an operator (and a test) can see a skip happen.
            _log.debug("feed index not summarized: another store is summarizing it")

    def start(self, handle: Any) -> None:
        conn, params = handle
        conn.pgconn.send_query_params(b"SELECT pg_notify($1, '')", params)

    def finish(self, handle: Any, timeout: float) -> bool:
        pg = handle[0].pgconn
        pg.consume_input()
        if pg.is_busy():
            if not _select.select([pg.socket], [], [], timeout)[0]:
                return False
            pg.consume_input()
            if pg.is_busy():
                return False
        while (res := pg.get_result()) is not None:
            if res.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise psycopg.OperationalError(res.error_message.decode(errors="replace"))
        return True

    def close(self, handle: Any) -> None:
        try:
            handle[0].close()
        except Exception:  # noqa: BLE001 - a dead connection is closed anyway
            pass


def _suspect(conn: Any, since: float, suspect_before: float, ping_after: float, ping: bool) -> bool:
    """Whether an idle hot connection, checked in at ``since`` (monotonic), must be pinged
    before use: asked to, checked in before a connection failed (``suspect_before``: the
    server may have dropped them all), idle longer than ``ping_after``, or its socket has
    input (EOF or a FATAL message) — the sync pool's checkout rule (see ``_on_checkout``)."""
    return ping or since <= suspect_before or time.monotonic() - since > ping_after or _readable(conn)


class _SyncHotConnections:
    """The sync engine's autocommit connections for its one-statement appends and loads.

    The same as :class:`_HotConnections` for threads: a statement on one costs its round
    trip and nothing else — no SQLAlchemy checkout and checkin events, no autocommit
    switched on and off, no reset on return (together about a quarter of a one-event
    append's client CPU). Any thread may take one; at most ``size`` are open, and a caller
    finding none idle then gets ``None`` and takes the pooled path instead of waiting.
    """

    def __init__(self, connect: Any, size: int, ping_after: float) -> None:
        self._connect = connect
        self._size = size
        self._ping_after = ping_after
        self._lock = threading.Lock()
        self._idle: list[tuple[Any, float]] = []
        self._open = 0
        self._closed = False

    def get(self, *, suspect_before: float, ping: bool) -> Any:
        """A live connection, or ``None`` when ``size`` are in use (see
        :meth:`_HotConnections.get` for the arguments).

        Raises:
            StorageError: the store was closed.
        """
        while True:
            with self._lock:
                if self._closed:
                    raise StorageError("the store is closed", retryable=False)
                if not self._idle:
                    if self._open >= self._size:
                        return None
                    self._open += 1
                    conn = None
                else:
                    conn, since = self._idle.pop()
            if conn is None:
                try:
                    return self._connect()
                except BaseException:
                    with self._lock:
                        self._open -= 1
                    raise
            if conn.closed or conn.broken:
                self._discard(conn)
                continue
            if _suspect(conn, since, suspect_before, self._ping_after, ping):
                try:
                    conn.execute("")
                except psycopg.Error:
                    self._discard(conn)
                    continue
            return conn

    def put(self, conn: Any, ok: bool) -> None:
        """Return a connection; ``ok=False`` (a failed statement) drops it."""
        with self._lock:
            if (
                ok
                and not self._closed
                and not (conn.closed or conn.broken)
                and conn.info.transaction_status == _IDLE
            ):
                self._idle.append((conn, time.monotonic()))
                return
        self._discard(conn)

    def _discard(self, conn: Any) -> None:
        with self._lock:
            self._open -= 1
        try:
            conn.close()
        except psycopg.Error:
            pass

    def close(self) -> None:
        """Close every idle connection (the rest close as they come back) and refuse
        further use."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            self._discard(conn)


class _HotConnections:
    """The async engine's autocommit connections for its one-statement appends and loads.

    Used from engine code running in a greenlet (see :mod:`eventstore.engine.async_bridge`), on one event
    loop. The connections stay in autocommit, so a statement costs one awaited round trip
    and nothing else: no pool events, no autocommit switching, no reset on return (what
    the SQLAlchemy pool would add, about as much client CPU as psycopg's own work). At most
    ``size`` are open; a caller beyond that waits for one to come back. A connection that
    sat idle longer than ``ping_after`` seconds, or whose socket has something to read, is
    pinged first and replaced when dead, as the sync pool's checkout does.
    """

    def __init__(self, connect: Any, size: int, ping_after: float) -> None:
        self._connect = connect
        self._size = size
        self._ping_after = ping_after
        self._idle: list[tuple[Any, float]] = []
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    def get(self, *, suspect_before: float, ping: bool) -> Any:
        """A live connection (awaits on the loop when one must be opened or waited for).

        Args:
            suspect_before: connections checked in before this (monotonic) instant are
                pinged (a connection failed since: the server may have dropped them all).
            ping: ping whatever connection is handed out.

        Raises:
            StorageError: the store was closed.
        """
        while True:
            if self._closed:
                raise StorageError("the store is closed", retryable=False)
            if self._idle:
                conn, since = self._idle.pop()
                if conn.closed or conn.broken:
                    self._open -= 1
                    continue
                if _suspect(conn, since, suspect_before, self._ping_after, ping):
                    try:
                        await_(conn.execute(""))
                    except psycopg.Error:
                        self._discard(conn)
                        continue
                return conn
            if self._open < self._size:
                self._open += 1
                try:
                    return await_(self._connect())
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await_(waiter)

    def put(self, conn: Any, ok: bool) -> None:
        """Return a connection; ``ok=False`` (a failed or cancelled statement) drops it."""
        if (
            ok
            and not self._closed
            and not (conn.closed or conn.broken)
            and conn.info.transaction_status == _IDLE
        ):
            self._idle.append((conn, time.monotonic()))
        else:
            self._discard(conn)
        self._wake()

    def _discard(self, conn: Any) -> None:
        self._open -= 1
        try:
            await_(conn.close())
        except psycopg.Error:
            pass

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        """Close every idle connection (the rest close as they come back) and refuse
        further use; waiting callers get :class:`StorageError`."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            self._discard(conn)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()


class _AwaitedCursor:
    """A psycopg ``AsyncCursor`` driven from sync code inside a greenlet: each call awaits
    on the event loop (SQLAlchemy's ``await_``), so the hot statements keep their psycopg
    options (``binary=``, ``prepare=``) on both engines."""

    __slots__ = ("_cur",)

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def __enter__(self) -> _AwaitedCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        # A client-side cursor holds nothing on the server: dropping it is enough.
        self._cur = None

    @property
    def description(self) -> Any:
        return self._cur.description

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    def execute(self, query: str, params: Any = None, **options: Any) -> _AwaitedCursor:
        await_(self._cur.execute(query, params, **options))
        return self

    def fetchone(self) -> Any:
        return await_(self._cur.fetchone())

    def fetchall(self) -> Any:
        return await_(self._cur.fetchall())

    def nextset(self) -> bool | None:
        return bool(self._cur.nextset())  # the results are all in: no I/O


class _AsyncListenProbe(AsyncProbe):
    """:class:`_ListenProbe` on psycopg's ``AsyncConnection`` (``notifies`` awaited)."""

    def __init__(self, engine: Any) -> None:
        self._db = engine

    async def connect(self) -> Any:
        cargs, cparams = self._db.dialect.create_connect_args(self._db.url)
        params = {"connect_timeout": 5, **cparams, "autocommit": True}
        conn = await psycopg.AsyncConnection.connect(*cargs, **params)
        try:
            channel = await (await conn.execute(feed_channel())).fetchone()
            if channel is None or channel[0] is None:
                raise RuntimeError("no events table: the database is not migrated")
            await conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel[0])))
        except BaseException:
            await conn.close()
            raise
        return conn

    async def changed(self, handle: Any, timeout: float) -> bool:
        async for _ in handle.notifies(timeout=timeout, stop_after=1):
            return True
        return False

    async def close(self, handle: Any) -> None:
        try:
            await handle.close()
        except Exception:  # noqa: BLE001 - a dead connection is closed anyway
            pass


class PostgresStorage(SqlStorage):
    """Storage on PostgreSQL (``postgresql+psycopg://user:pw@host/db``)."""

    driver_error = psycopg.Error

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 5,
        max_overflow: int = 10,
        pool_timeout: float = 30.0,
        connect_timeout: int | None = None,
        prepare_threshold: int | None = 5,
        echo: bool = False,
        ping_after_idle_s: float = 0.5,
        partitions: int = 0,
        use_asyncio: bool = False,
    ) -> None:
        #: hash partitions by session that `migrate` creates the event and snapshot
        #: tables with (0: plain tables, or the server's ``eventstore.partitions``).
        self.partitions = _partition_count(partitions, "partitions")
        u = make_url(url)
        if u.drivername in ("postgresql", "postgres"):
            u = u.set(drivername="postgresql+psycopg")  # psycopg 3, not the psycopg2 default
        connect_args: dict[str, Any] = {"prepare_threshold": prepare_threshold}
        if connect_timeout is not None:
            connect_args["connect_timeout"] = connect_timeout
        options: dict[str, Any] = {
            "pool_size": pool_size,
            "max_overflow": max_overflow,
            "pool_timeout": pool_timeout,
            "connect_args": connect_args,
            "echo": echo,
        }
        # With use_asyncio the engine is the sync face of an asyncio engine over psycopg's
        # AsyncConnection: it is used inside a greenlet (see eventstore.async_store), and
        # every round trip awaits on the event loop.
        self._hot_pool: _HotConnections | _SyncHotConnections
        if use_asyncio:
            engine = create_async_engine(u, **options).sync_engine
        else:
            engine = create_engine(u, **options)
        cargs, cparams = engine.dialect.create_connect_args(engine.url)
        hot_params = {**cparams, **connect_args, "autocommit": True}
        if use_asyncio:
            self._hot_pool = _HotConnections(
                partial(psycopg.AsyncConnection.connect, *cargs, **hot_params),
                pool_size,
                float(ping_after_idle_s),
            )
        else:
            self._hot_pool = _SyncHotConnections(
                partial(psycopg.Connection.connect, *cargs, **hot_params),
                pool_size,
                float(ping_after_idle_s),
            )
        self._asyncio = use_asyncio
        # PgBouncer in transaction mode: no prepared statement at all, not even the load's.
        self._prepare_load = prepare_threshold is not None
        #: Compiled catalogue statements by shape (see :meth:`fetch_all`).
        self._q_shapes: dict[Any, Compiled] = {}
        self._ping_after = float(ping_after_idle_s)
        # Pooled connections checked in before this (monotonic) instant are suspect: a
        # connection failed since, so the server may have dropped them all.
        self._suspect_before = 0.0
        # Set (per thread) while the append fast path checks out its connection.
        self._hot = threading.local()
        event.listen(engine, "checkin", _on_checkin)
        event.listen(engine, "checkout", self._on_checkout)
        super().__init__(engine, url)
        self._q_feed_barrier = Compiled(_feed_barrier(), engine.dialect)

    def _on_checkout(self, dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        """Liveness check at checkout, without a round trip on the append hot path.

        Every checkout is pre-pinged (one round trip), except the append fast path's: its
        connection is pinged only when it is suspect — idle in the pool longer than
        ``ping_after_idle_s`` (HikariCP's alive-bypass window), its socket has something to
        read (the server closed it or sent a FATAL message while it sat idle: terminated
        backend, restart, crash), or a connection failed since it was checked in. A dead
        one raises ``DisconnectionError``: the pool discards it and checks out a fresh one.

        Why not skip the ping for reads too: a backend killed a moment before the checkout
        may not have closed its socket yet, and then the first statement fails. A read would
        surface that as an error although nothing was wrong with the session; an append can
        fail that way mid-flight anyway (retryable ``StorageError``), so its hot loop takes
        the bypass and every other call keeps the silent replacement.
        """
        since = record.info.get(_CHECKED_IN)
        if since is None:
            return  # just connected
        if dbapi_conn.closed or dbapi_conn.broken:
            raise DisconnectionError("the pooled connection is closed")
        if (
            getattr(self._hot, "active", False)
            and time.monotonic() - since <= self._ping_after
            and since > self._suspect_before
            and not _readable(record.driver_connection)
        ):
            return
        try:
            self.engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:  # noqa: BLE001 - any failure: replace the connection
            raise DisconnectionError(f"the pooled connection is dead: {exc}") from exc

    def append_fast(
        self,
        session_pk: int,
        old_head: int,
        old_hash: bytes,
        rows: Sequence[EventRow],
        head_turn: int,
        snapshots: Sequence[SnapshotRow],
        blobs: Mapping[bytes, bytes],
        effect: CatalogueEffect | None = None,
    ) -> bool:
        first = rows[0]
        # Batches with provider-native data take the general statement (the hot ones,
        # without, keep their arrays as they are).
        if any(
            (r.recorded_at, r.actor, r.metadata, r.native)
            != (first.recorded_at, first.actor, first.metadata, None)
            for r in rows
        ):
            return super().append_fast(
                session_pk, old_head, old_hash, rows, head_turn, snapshots, blobs, effect
            )
        if len(rows) == 1 and not snapshots and not blobs:
            return self._append_one(session_pk, old_head, old_hash, first, head_turn, effect)
        params = {
            **effect_params(effect),
            "pk": session_pk,
            "old_head": old_head,
            "old_hash": old_hash,
            "head": rows[-1].version,
            "hash": rows[-1].hash,
            "turn": head_turn,
            "recorded_at": first.recorded_at,
            "actor": first.actor,
            "metadata": first.metadata,
            "versions": [r.version for r in rows],
            "event_ids": [r.event_id for r in rows],
            "types": [r.type for r in rows],
            "turns": [r.turn for r in rows],
            "payloads": [r.payload for r in rows],
            "hashes": [r.hash for r in rows],
            "digests": list(blobs),
            "bodies": list(blobs.values()),
            "s_versions": [n.version for n in snapshots],
            "s_reducers": [n.reducer_version for n in snapshots],
            "s_rests": [n.rest for n in snapshots],
            "s_digests": [n.message_digests for n in snapshots],
        }
        sql = _APPEND_FAST if snapshots or blobs else _APPEND_FAST_NO_SNAPSHOT
        return self._run_hot(sql, params, binary=True) == len(rows)

    def append_batches(self, batches: Sequence[TurnBatch]) -> list[bool]:
        if not batches:
            return []
        events = [r for b in batches for r in b.rows]
        blobs = [(b.session_pk, d, body) for b in batches for d, body in b.blobs.items()]
        snaps = [n for b in batches for n in b.snapshots]
        params = {
            "pks": [b.session_pk for b in batches],
            "old_heads": [b.old_head for b in batches],
            "old_hashes": [b.old_hash for b in batches],
            "writers": [b.writer for b in batches],
            "heads": [b.rows[-1].version if b.rows else b.old_head for b in batches],
            "hashes": [b.rows[-1].hash if b.rows else b.old_hash for b in batches],
            "turns": [b.head_turn for b in batches],
            "releases": [b.release for b in batches],
            "claims": [b.claim for b in batches],
            **_effect_arrays(batches),
            "seen": max(b.seen_at for b in batches),
            "e_pks": [r.session_pk for r in events],
            "e_versions": [r.version for r in events],
            "e_ids": [r.event_id for r in events],
            "e_types": [r.type for r in events],
            "e_turns": [r.turn for r in events],
            "e_payloads": [r.payload for r in events],
            "e_times": [r.recorded_at for r in events],
            "e_actors": [r.actor for r in events],
            "e_metas": [r.metadata for r in events],
            "e_hashes": [r.hash for r in events],
            "e_natives": [r.native for r in events],
            "b_pks": [pk for pk, _, _ in blobs],
            "b_digests": [d for _, d, _ in blobs],
            "b_bodies": [body for _, _, body in blobs],
            "s_pks": [n.session_pk for n in snaps],
            "s_versions": [n.version for n in snaps],
            "s_reducers": [n.reducer_version for n in snaps],
            "s_rests": [n.rest for n in snaps],
            "s_digests": [n.message_digests for n in snaps],
        }
        with self._errors(), self._autocommit(hot=True) as cur:
            # Prepared: planning this statement costs about as much as running it.
            cur.execute(_APPEND_BATCHES, params, binary=True, prepare=self._prepare_load or None)
            (moved,) = cur.fetchone()
        done = set(moved)
        if events and done:
            self._committed()
        return [b.session_pk in done for b in batches]

    def _append_one(
        self,
        session_pk: int,
        old_head: int,
        old_hash: bytes,
        row: EventRow,
        head_turn: int,
        effect: CatalogueEffect | None = None,
    ) -> bool:
        params = {
            **effect_params(effect),
            "pk": session_pk,
            "old_head": old_head,
            "old_hash": old_hash,
            "head": row.version,
            "hash": row.hash,
            "turn": head_turn,
            "event_id": row.event_id,
            "type": row.type,
            "payload": row.payload,
            "recorded_at": row.recorded_at,
            "actor": row.actor,
            "metadata": row.metadata,
        }
        return self._run_hot(_APPEND_ONE, params, binary=False) == 1

    def _run_hot(self, sql: str, params: Mapping[str, Any], *, binary: bool) -> int:
        """Run one append statement on a pooled connection; its row count.

        A statement whose last part is a SELECT reports its first column instead.
        """
        with self._errors(), self._autocommit(hot=True) as cur:
            cur.execute(sql, params, binary=binary)
            if cur.description is None:
                count = int(cur.rowcount)
            else:
                count = int(cur.fetchone()[0])
        if count:
            self._committed()
        return count

    @contextmanager
    def _autocommit(self, *, hot: bool) -> Iterator[Any]:
        """A psycopg cursor in autocommit, for one statement.

        A single statement is atomic and sees one snapshot of the database: autocommit
        spares the BEGIN and COMMIT round trips. It runs on a hot connection (see
        :class:`_SyncHotConnections`), or, when every one is in use, on a pooled one with no
        SQLAlchemy Connection built around it. ``hot``: take the connection without the
        pre-ping (see :meth:`_on_checkout`).
        """
        conn = self._hot_pool.get(suspect_before=self._suspect_before, ping=not hot)
        if conn is not None:
            with self._hot_cursor(conn) as cur:
                yield cur
            return
        # Only the sync pool hands out none (more threads than pool_size): a pooled one.
        self._hot.active = hot
        try:
            fairy = self.engine.raw_connection()
        finally:
            self._hot.active = False
        try:
            pg: Any = fairy.driver_connection
            pg.autocommit = True
            try:
                with pg.cursor() as cur:  # a psycopg cursor: binary=, %b, prepare=
                    yield cur
            finally:
                if not (pg.closed or pg.broken):  # a broken one is replaced at checkout
                    pg.autocommit = False
        except psycopg.OperationalError:
            # Drop the connection here: returned to the pool, it would be rolled back
            # first, and that fails on a dead socket with an ERROR log and a traceback.
            fairy.invalidate()
            raise
        finally:
            fairy.close()

    def fetch_all(self, key: Any, stmt: Any, params: Mapping[str, Any]) -> list[Any]:
        # One statement in autocommit: no BEGIN/COMMIT round trips (a catalogue page).
        q = self._q_shapes.get(key)
        if q is None:
            q = self._q_shapes.setdefault(key, Compiled(stmt, self.engine.dialect))
        with self._errors(), self._autocommit(hot=True) as cur:
            cur.execute(q.sql, q.args(params))
            return list(cur.fetchall())

    def fetch_one(self, q: Compiled, params: Mapping[str, Any] | None = None) -> Any:
        """The first row of one compiled statement, run alone in autocommit (``None``: no row).

        For small statements outside any transaction (a server's WAL position, a replica's
        replay state): one round trip, no BEGIN/COMMIT, errors mapped as everywhere.
        """
        with self._errors(), self._autocommit(hot=True) as cur:
            cur.execute(q.sql, q.args(params or {}))
            return cur.fetchone()

    def _migration_options(self, conn: Connection) -> dict[str, Any]:
        n = self.partitions or _partition_setting(
            conn.execute(select(func.current_setting(PARTITION_SETTING, True))).scalar()
        )
        state = conn.execute(_PARTITION_STATE).first()
        if n and state is not None and (not state[0] or state[1] != n):
            # The tables exist: turning them into partitioned ones is a data migration.
            have = f"{state[1]} partitions" if state[0] else "no partitions"
            raise SchemaError(
                f"the database {self.safe_url} already has its event tables with {have}, "
                f"not {n}; see docs/scaling.md to move them"
            )
        return {"partitions": n}

    @contextmanager
    def _hot_cursor(self, conn: Any) -> Iterator[Any]:
        pool = self._hot_pool
        ok = False
        try:
            with _AwaitedCursor(conn.cursor()) if self._asyncio else conn.cursor() as cur:
                yield cur
            ok = True
        except psycopg.OperationalError:
            self._suspect_before = time.monotonic()
            raise
        except psycopg.Error:
            ok = True  # a constraint or data error: the connection itself is fine
            raise
        finally:
            pool.put(conn, ok)

    def close(self) -> None:
        self._hot_pool.close()
        super().close()

    def _lock_clause(self, stmt: Any) -> Any:
        return stmt.with_for_update()

    def _seal_lock(self, stmt: Any, wait: bool) -> Any:
        # The background sealer skips a session an append holds and comes back later.
        return stmt.with_for_update(skip_locked=not wait)

    def _seal_barrier(self, tx: Tx) -> int | None:
        # Sealed events lie below the feed's barrier: no band reads them as pending, and no
        # transaction that could still append after them holds an older id.
        return self.feed_barrier(tx).below

    def _write_segment(
        self, tx: Tx, pk: int, turn: SealableTurn, prev: bytes, body: bytes, sealed: Sequence[SealedEvent]
    ) -> None:
        # The owner's function checks the range, copies end_hash and computes xact_digest
        # from the rows itself (migrations/versions/0011_seal_segments.py).
        tx.execute(
            select(func.eventstore_seal(pk, turn.first, turn.last, prev, body))
        ).all()

    def _new_xact(self) -> Any:
        # The column default would do for the barrier alone; raising it to the previous
        # event's keeps one session in version order when a transaction got its id before
        # another one that wrote the session's earlier versions.
        prev = events.alias("prev")
        earlier = (
            select(prev.c.xact)
            .where(
                prev.c.session_pk == bindparam("session_pk"),
                prev.c.version == bindparam("version") - literal_column("1"),
            )
            .scalar_subquery()
        )
        return func.greatest(literal_column(FEED_XACT), earlier)

    def _restore_xacts(self, tx: Tx, n: int, below: int, above: int) -> list[int] | None:
        # The feed's order is (xact, session, version): with the number of the session's
        # first remaining event, the restored (lower) versions sort right before it. The
        # number is below the barrier already, so a feed past it does not see them.
        return [above] * n

    feed_banded = True

    def feed_barrier(self, tx: Tx) -> FeedBarrier:
        r = self._fetchone(tx, self._q_feed_barrier, {})
        return FeedBarrier(int(r[0]), bool(r[1]))

    def _feed_barrier(self) -> Any:
        return _snapshot_xmin()

    def _before_band(self, tx: Tx) -> None:
        tx.exec_driver_sql(_BAND_SETTINGS)

    def read_band(self, *, after: tuple[int, int, int] | None, limit: int, upto: int) -> Band:
        # One round trip, in autocommit: the setting and the band's statement sent as one
        # query string, which the server runs as one implicit transaction. Its values are
        # inlined (integers only) because such a string takes no parameters.
        assert self._q_band is not None
        q = self._q_band
        values = {k: int(v) for k, v in q.args(self._band_params(after, limit, upto)).items()}
        sql = f"{_BAND_SETTINGS}; {q.sql % values}"
        for attempt in (1, 2):
            try:
                # Taken without the pre-ping, like an append's: a connection that died in
                # the pool just before (not yet seen as dead) fails the first attempt, and
                # the read, which changes nothing, is sent once more on a checked one.
                with self._errors(), self._autocommit(hot=True) as cur:
                    cur.execute(sql)
                    cur.nextset()
                    rows = cur.fetchall()
                break
            except StorageError as exc:
                if attempt == 2 or not exc.retryable:
                    raise
        try:
            band = self._band(rows, _unseen_sessions)
        except _UnseenSessions:
            # Their ids must come from the band's own snapshot (an erasure may remove one).
            return super().read_band(after=after, limit=limit, upto=upto)
        with self.read() as tx:
            return self._sealed_band(tx, band, after, limit, upto)

    #: A notification is sent after the commit, not by it: a writer that commits without
    #: one (raw SQL, a process killed in between) is found by this slow re-read.
    safety_poll = 1.0

    def _probe(self) -> Probe:
        return _ListenProbe(self.engine)

    def _signal(self) -> Signal:
        return _NotifySignal(self.engine)

    def _async_probe(self) -> AsyncProbe:
        return _AsyncListenProbe(self.engine)

    def _insert(self, table: Any) -> Any:
        return pg_insert(table)

    def _migration_lock(self, conn: Connection) -> None:
        conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))

    def _lock_snapshot_writes(self, tx: Any) -> None:
        # EXCLUSIVE conflicts with the ROW EXCLUSIVE lock every snapshot or blob write
        # takes: in-flight appends that write snapshots finish first, new ones wait.
        tx.exec_driver_sql("LOCK TABLE snapshots, snapshot_blobs IN EXCLUSIVE MODE")

    def _classify(self, orig: BaseException | None, invalidated: bool) -> ErrorKind:
        if isinstance(orig, psycopg.errors.UniqueViolation):
            constraint = getattr(orig.diag, "constraint_name", None) or ""
            if constraint == "pk_events" or _PARTITION_PK.fullmatch(constraint):
                return ErrorKind.VERSION_TAKEN
            if constraint == "ix_events_session_pk_event_id" or _PARTITION_EVENT_ID.fullmatch(
                constraint
            ):
                return ErrorKind.EVENT_ID_TAKEN
            return ErrorKind.OTHER
        if isinstance(orig, psycopg.errors.UndefinedTable):
            return ErrorKind.NO_SCHEMA
        if isinstance(orig, psycopg.errors.ProgramLimitExceeded) and not invalidated:
            # e.g. "index row requires N bytes": an OperationalError, yet a retry never helps.
            return ErrorKind.OTHER
        if isinstance(orig, psycopg.OperationalError) and _is_config_error(orig):
            # A wrong password, user or database fails the same way on every try.
            return ErrorKind.OTHER
        if invalidated or isinstance(orig, _RETRYABLE):
            if invalidated or isinstance(orig, psycopg.OperationalError):
                # Maybe the server went away: ping every pooled connection once.
                self._suspect_before = time.monotonic()
            return ErrorKind.RETRYABLE
        return ErrorKind.OTHER

    def load_parts(
        self, session_id: str, version: int | None, reducer_version: int
    ) -> LoadParts | None:
        # Learnt from every session row read (see _learn_key), so a load can name the
        # session's key (see _LOAD_BY_KEY).
        key = self.session_keys.key(session_id)
        params = {"id": session_id, "version": version, "rv": reducer_version, "pk": key}
        with self._errors():
            r = self._load_retried(params)
            if r is None and key is not None:
                # A key that no longer names this id (the session was erased): by id alone.
                self.session_keys.forget(session_id)
                r = self._load_retried({**params, "pk": None})
        if r is None:
            return LoadParts(None)
        row = self._learn_key(session_row(r))
        if row.parent_pk is not None:
            return LoadParts(row)
        sealed: tuple[tuple[int, bytes], ...] = ()
        v, base = (row.head if version is None else version), (r[11] or 0)
        if r[17] != v - base:
            # Some are sealed: their payloads, in one more round trip, are merged in by
            # version (any other gap, or a race with a seal or a compaction, takes the
            # general path).
            q = self._q_segments
            with self._errors(), self._autocommit(hot=True) as cur:
                cur.execute(q.sql, q.args({"pk": row.pk, "after": base, "upto": v}))
                sealed = self._sealed_payloads(cur.fetchall(), base, v)
            if r[17] + len(sealed) != v - base:
                return LoadParts(row)
        return LoadParts(
            row,
            complete=True,
            snap_version=r[11] or 0,
            rest=r[12],
            messages=r[13] or b"",
            n_digests=r[14],
            n_found=r[15],
            tail=r[16] or b"",
            n_tail=r[17],
            sealed=sealed,
        )

    def get_session(self, tx: Tx, session_id: str) -> SessionRow | None:
        return self._learn_key(super().get_session(tx, session_id))

    def lock_session(self, tx: Tx, session_id: str) -> SessionRow | None:
        return self._learn_key(super().lock_session(tx, session_id))

    def insert_session(self, tx: Tx, new: NewSession) -> SessionRow | None:
        return self._learn_key(super().insert_session(tx, new))

    def _learn_key(self, row: _Row) -> _Row:
        """Remember a session row's key for later loads of that session (a key that turns
        out wrong, e.g. of a rolled-back insert, only costs a load one more round trip)."""
        if row is not None:
            self.session_keys.learn(row.id, row.pk)
        return row

    def _load_retried(self, params: Mapping[str, Any]) -> Any:
        try:
            # Without the checkout's pre-ping round trip (the append fast path's
            # alive-bypass window)...
            return self._load_row(params, hot=True)
        except psycopg.OperationalError:
            # ...and, since a read is idempotent, once more on a pinged connection if
            # that one turned out dead (killed backend, server restart): a load never
            # fails for a connection that was merely stale.
            self._suspect_before = time.monotonic()
            return self._load_row(params, hot=False)

    def _load_row(self, params: Mapping[str, Any], *, hot: bool) -> Any:
        """The one row of :data:`_LOAD` (or :data:`_LOAD_BY_KEY` when ``params`` name the
        session's key), on a hot autocommit connection (see :meth:`_autocommit`)."""
        sql = _LOAD if params["pk"] is None else _LOAD_BY_KEY
        with self._autocommit(hot=hot) as cur:
            # Prepared at its first use on a connection, not the sixth: a cold load then
            # skips parsing and analysing the statement every time.
            cur.execute(sql, params, binary=True, prepare=self._prepare_load or None)
            return cur.fetchone()


# A root session's load in one round trip: the session row, its newest usable snapshot
# at or below the version (made by this reducer, or the compaction baseline whatever its
# reducer), the snapshot's message bodies joined in order by SQL (the digests are split
# with generate_series, so the order is the snapshot's), and the tail payloads joined in
# version order. Python then parses two JSON arrays. Branches get only their row (the
# lineage is read the general way). LATERAL joins rather than CTEs: cheaper to plan,
# which is most of a cold load's server time. {KEY} is how the snapshot and event scans
# name the session's key (see _LOAD_BY_KEY).
_LOAD_TEMPLATE = f"""
SELECT s.pk, s.id, s.parent_pk, s.fork_version, s.head, s.head_hash, s.head_turn,
       s.baseline, s.baseline_hash, s.baseline_turn, s.created_at,
       n.version, n.rest, m.bodies, m.n_digests, m.n_found, t.payloads, t.n
FROM sessions s
LEFT JOIN LATERAL (
    -- `|| ''` detoasts the digests once, here, not once per message in the split below.
    SELECT x.version, x.rest, x.message_digests || ''::bytea AS md
    FROM snapshots x
    WHERE x.session_pk = {{KEY}} AND s.parent_pk IS NULL AND x.version > 0
      AND x.version <= COALESCE(%(version)s::int, s.head)
      AND (x.reducer_version = %(rv)s OR x.version = s.baseline)
    ORDER BY x.version DESC
    LIMIT 1
) n ON true
LEFT JOIN LATERAL (
    -- One index probe per digest, as a scalar subquery: a join here may be planned as a
    -- hash join over every blob of every session.
    SELECT string_agg(c.body, ','::bytea ORDER BY c.i) AS bodies,
           count(*) AS n_digests, count(c.body) AS n_found
    FROM (
        SELECT g.i, (
            SELECT b.body FROM snapshot_blobs b
            WHERE b.digest = substring(n.md FROM g.i * {DIGEST_SIZE} + 1 FOR {DIGEST_SIZE})
        ) AS body
        FROM generate_series(0, length(n.md) / {DIGEST_SIZE} - 1) AS g(i)
        OFFSET 0  -- keeps the subquery from being inlined twice, into both aggregates
    ) c
) m ON true
LEFT JOIN LATERAL (
    SELECT string_agg(e.payload, ','::bytea ORDER BY e.version) AS payloads, count(*) AS n
    FROM events e
    WHERE s.parent_pk IS NULL AND e.session_pk = {{KEY}}
      AND e.version > COALESCE(n.version, 0)
      AND e.version <= COALESCE(%(version)s::int, s.head)
) t ON true
WHERE s.id = %(id)s
"""
_LOAD = _LOAD_TEMPLATE.replace("{KEY}", "s.pk")
# The same with the session's key given as well, when the storage knows it (see
# _KEY_PARAM): the partitions of other sessions are pruned when the execution starts.
_LOAD_BY_KEY = _LOAD_TEMPLATE.replace("{KEY}", _KEY_PARAM) + "  AND s.pk = %(pk)s::int\n"

