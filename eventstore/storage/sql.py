"""Statements shared by both backends (SQLAlchemy Core), and the one error mapper.

The dialect modules override only what differs: how a write transaction begins, row
locking, "insert unless present" / upsert, and how a driver error is classified.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    LargeBinary,
    and_,
    any_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    inspect,
    literal,
    null,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.util import await_only

from eventstore.core.rows import (
    DIGEST_SIZE,
    Band,
    CatalogueEffect,
    CompactionRow,
    Erasure,
    EventRow,
    FeedBarrier,
    FeedRow,
    LoadParts,
    NewSession,
    RewindRow,
    Segment,
    SessionControl,
    SessionRow,
    SnapshotRow,
    TombstoneRow,
    TurnBatch,
)
from eventstore.errors import ConcurrencyError, EventStoreError, SchemaError, StorageError
from eventstore.storage.catalogue import CATALOGUE_VALUES, effect_params
from eventstore.storage.catalogue import forget as forget_info
from eventstore.storage.interface import AsyncChangeWatcher, ChangeWatcher, EventIdRace, Storage, Tx
from eventstore.storage.schema import (
    EVENT_COLUMNS,
    VERSION_TABLE,
    compaction_permits,
    compactions,
    events,
    sessions,
    snapshot_blobs,
    snapshots,
    tombstones,
)
from eventstore.storage.sealed import Sealing
from eventstore.storage.rewind_sql import keep_line, mark_line, record_rewind, select_rewinds
from eventstore.storage.urls import mask_url
from eventstore.storage.watch import AsyncProbe, Notifier, Probe, Signal, TaskWatcher, ThreadWatcher

__all__ = [
    "ErrorKind",
    "SqlStorage",
    "Compiled",
    "mask_url",
    "insert_events_stmt",
    "read_feed_stmt",
    "read_band_stmt",
]

# SQLite's default limit is 32766 bound parameters; stay far below it.
_CHUNK = 500

_EVENT_KEYS = tuple(c.name for c in EVENT_COLUMNS)  # EventRow's field order
_SESSION_COLS = tuple(sessions.c)
_SNAPSHOT_COLS = tuple(snapshots.c)


class Compiled:
    """A Core statement compiled once for one dialect, executed on the DBAPI cursor.

    The hot statements (append, load) skip SQLAlchemy's per-execution work (statement
    construction, cache-key generation, result processing): the SQL is still declared as
    Core, but compiled at start-up. Parameters are passed by name.
    """

    __slots__ = ("sql", "keys", "defaults")

    def __init__(self, stmt: Any, dialect: Dialect) -> None:
        c = stmt.compile(dialect=dialect)
        self.sql: str = c.string
        self.keys: tuple[str, ...] | None = tuple(c.positiontup) if c.positional else None
        # Values of literals the statement binds itself (`version > 0`, `LIMIT 1`).
        self.defaults: dict[str, Any] = {
            k: v for k, v in c.params.items() if v is not None
        }

    def args(self, params: Mapping[str, Any]) -> Any:
        """The parameters in the driver's style (a tuple for qmark, the mapping for pyformat)."""
        if self.defaults:
            params = {**self.defaults, **params}
        if self.keys is None:
            return params
        return tuple(params[k] for k in self.keys)


_P = bindparam

S_GET_SESSION = select(*_SESSION_COLS).where(sessions.c.id == _P("id"))
S_GET_SESSION_PK = select(*_SESSION_COLS).where(sessions.c.pk == _P("pk"))
S_SET_HEAD = (
    update(sessions)
    .where(sessions.c.pk == _P("p_pk"))
    .values(head=_P("p_head"), head_hash=_P("p_hash"), head_turn=_P("p_turn"))
)
# The version check built into the write: it matches only if the head is what we saw.
S_MOVE_HEAD = (
    update(sessions)
    .where(
        sessions.c.pk == _P("p_pk"),
        sessions.c.head == _P("p_old_head"),
        sessions.c.head_hash == _P("p_old_hash"),
        sessions.c.closed_at.is_(None),
    )
    .values(head=_P("p_head"), head_hash=_P("p_hash"), head_turn=_P("p_turn"), **CATALOGUE_VALUES)
)

def insert_events_stmt(xact: Any) -> Any:
    """The INSERT of one event row, its columns bound by name and ``xact`` given by the
    dialect's expression (see :meth:`SqlStorage._new_xact`)."""
    values: dict[str, Any] = {c.name: _P(c.name) for c in EVENT_COLUMNS}
    values["xact"] = xact
    return insert(events).values(values)


# The feed: events after a key (xact, session_pk, version), in that order.
_FEED_KEY = tuple_(events.c.xact, events.c.session_pk, events.c.version)
# FeedRow's order: the event's columns, its feed number and session id, then its native
# data (last, so that rows without it keep their shape).
_FEED_COLS = (*EVENT_COLUMNS[:-1], events.c.xact, sessions.c.id, events.c.native)


def read_feed_stmt() -> Any:
    """The feed's page after a key, where ``xact`` is unique and the table's own key
    (SQLite): a range scan of the table after ``:x``, each row's session id looked up by
    its key as it goes (already in order: no sort)."""
    return (
        select(*_FEED_COLS)
        .join_from(events, sessions, sessions.c.pk == events.c.session_pk)
        .where(events.c.xact > _P("x"))
        .order_by(events.c.xact)
        .limit(_P("lim"))
    )


def read_band_stmt(barrier: Any) -> Any:
    """A banded feed's page (PostgreSQL): the rows with ``:x <= xact <= :upto`` after the
    key, cut at ``:lim``, and below ``barrier`` (a SQL expression) — which the statement
    reads itself, in its own snapshot, and returns in the last columns of every row with
    whether committed rows wait at or above it (``pending``).

    The BRIN index on ``xact`` finds the band as a few page ranges; the rows are sorted in
    memory. The barrier is the one row the events are left-joined to, so an empty band
    still returns it (one row of NULL events, sorted last). Session ids are not joined:
    every page would hash and sort them again (the storage keeps them, see
    :meth:`SqlStorage.read_band`).
    """
    # Materialized, and the band's top computed there: inlined, the barrier's expression
    # would be evaluated again for every row the bitmap scan rechecks.
    x = select(barrier.label("below")).subquery("x")
    top = func.least(_P("upto"), x.c.below - 1)
    waiting = exists().where(events.c.xact >= x.c.below)
    b = select(x.c.below, top.label("top"), waiting.label("pending")).cte("b").prefix_with("MATERIALIZED")
    e = events.c
    return (
        select(*EVENT_COLUMNS[:-1], e.xact, e.native, b.c.below, b.c.pending)
        .select_from(
            b.outerjoin(
                events,
                and_(
                    _FEED_KEY > tuple_(_P("x"), _P("s"), _P("v")),
                    e.xact >= _P("x"),
                    # Implied by the next one, but a bound the index scan can use itself.
                    e.xact <= _P("upto"),
                    e.xact <= b.c.top,
                ),
            )
        )
        .order_by(e.xact, e.session_pk, e.version)
        .limit(_P("lim"))
    )


#: The ids of some sessions, by key.
S_SESSION_IDS = select(sessions.c.pk, sessions.c.id).where(sessions.c.pk == any_(_P("pks")))


class SessionKeys:
    """Session id <-> key, for the sessions a storage has seen.

    A key never changes and is never given to another id (PostgreSQL's sequence does not
    hand a number out twice, even after a rollback), so what is learnt stays true by key;
    an id can name a new key once its session was erased, so a caller that finds a key
    stale forgets it. Bounded: beyond ``KEPT`` sessions (about 100 bytes each) everything
    is forgotten at once, to be learnt again. Plain dict operations: safe across threads.
    """

    KEPT = 100_000

    def __init__(self) -> None:
        self._keys: dict[str, int] = {}
        self._ids: dict[int, str] = {}

    def key(self, session_id: str) -> int | None:
        """The key last learnt for this id, if any."""
        return self._keys.get(session_id)

    def session_id(self, pk: int) -> str:
        """The id of this key. Raises ``KeyError`` for a key not learnt (yet)."""
        return self._ids[pk]

    def learn(self, session_id: str, pk: int) -> None:
        """Remember that ``pk`` is the key of ``session_id``."""
        if self._keys.get(session_id) == pk:
            return
        if len(self._keys) >= self.KEPT or len(self._ids) >= self.KEPT:
            self._keys.clear()
            self._ids.clear()
        self._keys[session_id] = pk
        self._ids[pk] = session_id

    def forget(self, session_id: str) -> None:
        """Drop a key found stale for this id (its session was erased)."""
        self._keys.pop(session_id, None)


# A streaming turn's group-commit step for one session: the same checked head move, also
# checking that the turn still holds the session's lease and renewing it.
_TURN_MOVE = update(sessions).where(
    sessions.c.pk == _P("p_pk"),
    sessions.c.head == _P("p_old_head"),
    sessions.c.head_hash == _P("p_old_hash"),
    sessions.c.writer == _P("p_writer"),
    sessions.c.closed_at.is_(None),
)
S_TURN_MOVE = _TURN_MOVE.values(
    head=_P("p_head"),
    head_hash=_P("p_hash"),
    head_turn=_P("p_turn"),
    writer_seen=_P("p_seen"),
    **CATALOGUE_VALUES,
)
S_TURN_CLAIM = (
    update(sessions)
    .where(
        sessions.c.pk == _P("p_pk"),
        sessions.c.head == _P("p_old_head"),
        sessions.c.head_hash == _P("p_old_hash"),
        sessions.c.writer.is_(None),
        sessions.c.closed_at.is_(None),
    )
    .values(
        head=_P("p_head"),
        head_hash=_P("p_hash"),
        head_turn=_P("p_turn"),
        writer=_P("p_writer"),
        writer_seen=_P("p_seen"),
        **CATALOGUE_VALUES,
    )
)
S_TURN_MOVE_RELEASE = _TURN_MOVE.values(
    head=_P("p_head"),
    head_hash=_P("p_hash"),
    head_turn=_P("p_turn"),
    writer=null(),
    writer_seen=null(),
    **CATALOGUE_VALUES,
)
_CONTROL_COLS = (
    sessions.c.pk,
    sessions.c.head,
    sessions.c.head_hash,
    sessions.c.writer,
    sessions.c.writer_seen,
    sessions.c.closed_at,
    sessions.c.closed_reason,
)
_WITH_HEAD_EVENT = select(
    *_CONTROL_COLS, events.c.type, events.c.payload, events.c.recorded_at
).select_from(
    sessions.outerjoin(
        events, and_(events.c.session_pk == sessions.c.pk, events.c.version == sessions.c.head)
    )
)
S_CONTROL = select(*_CONTROL_COLS).where(sessions.c.pk == _P("pk"))
S_CONTROL_HEAD = _WITH_HEAD_EVENT.where(sessions.c.pk == _P("pk"))
S_READ_PAYLOADS = (
    select(events.c.payload)
    .where(
        events.c.session_pk == _P("pk"),
        events.c.version > _P("after"),
        events.c.version <= _P("upto"),
    )
    .order_by(events.c.version)
)
_RANGE = select(*EVENT_COLUMNS).where(
    events.c.session_pk == _P("pk"),
    events.c.version > _P("after"),
    events.c.version <= _P("upto"),
)
S_READ_EVENTS_ASC = _RANGE.order_by(events.c.version).limit(_P("lim"))
S_READ_EVENTS_DESC = _RANGE.order_by(events.c.version.desc()).limit(_P("lim"))
S_EVENT_AT = select(*EVENT_COLUMNS).where(
    events.c.session_pk == _P("pk"), events.c.version == _P("version")
)
S_SNAPSHOTS_RANGE = (
    select(*_SNAPSHOT_COLS)
    .where(
        snapshots.c.session_pk == _P("pk"),
        snapshots.c.version > _P("after"),
        snapshots.c.version <= _P("upto"),
    )
    .order_by(snapshots.c.version)
)
_NO_LIMIT = 2**62
# An erasure's permit covers every version a session can have (versions are int4).
_ALL_VERSIONS = 2**31 - 1


def _ordered_blobs() -> Any:
    """The bodies of the ``n`` digests concatenated in ``md``, one row each, in their order
    (NULL for a missing blob): a recursive CTE counts 0..n-1 and slices the digests."""
    idx = select(literal(0).label("i")).cte("idx", recursive=True)
    idx = idx.union_all(select(idx.c.i + 1).where(idx.c.i + 1 < _P("n")))
    digest = func.substr(_P("md", type_=LargeBinary), idx.c.i * DIGEST_SIZE + 1, DIGEST_SIZE)
    return (
        select(snapshot_blobs.c.body)
        .select_from(idx.outerjoin(snapshot_blobs, snapshot_blobs.c.digest == digest))
        .order_by(idx.c.i)
    )


class ErrorKind(enum.Enum):
    """What a driver error means to eventstore (decided per dialect)."""

    VERSION_TAKEN = "version-taken"  # unique violation on the events primary key
    EVENT_ID_TAKEN = "event-id-taken"  # unique violation on (session_pk, event_id)
    RETRYABLE = "retryable"  # lost connection, serialization failure, busy database
    NO_SCHEMA = "no-schema"  # a table is missing: not migrated
    OTHER = "other"


def session_row(r: Any) -> SessionRow:
    # Positional, in the column order of schema.sessions (_SESSION_COLS).
    return SessionRow(
        pk=r[0],
        id=r[1],
        parent_pk=r[2],
        fork_version=r[3],
        head=r[4],
        head_hash=bytes(r[5]),
        head_turn=r[6],
        baseline=r[7],
        baseline_hash=None if r[8] is None else bytes(r[8]),
        baseline_turn=r[9],
        created_at=r[10],
    )


def _event(r: Any) -> EventRow:
    return EventRow(
        session_pk=r[0],
        version=r[1],
        event_id=r[2],
        type=r[3],
        turn=r[4],
        payload=bytes(r[5]),
        recorded_at=r[6],
        actor=r[7],
        metadata=None if r[8] is None else bytes(r[8]),
        hash=bytes(r[9]),
        native=None if r[10] is None else bytes(r[10]),
    )


def _control(r: Any) -> SessionControl:
    # Positional: _CONTROL_COLS, then (with the head event) its type, payload, recorded_at.
    extra = (r[7], None if r[8] is None else bytes(r[8]), r[9]) if len(r) > 7 else (None, None, None)
    return SessionControl(r[0], r[1], bytes(r[2]), r[3], r[4], r[5], r[6], *extra)


def _snapshot(r: Any) -> SnapshotRow:
    return SnapshotRow(
        session_pk=r[0],
        version=r[1],
        reducer_version=r[2],
        rest=bytes(r[3]),
        message_digests=bytes(r[4]),
    )


class SqlStorage(Sealing, Storage):
    """Storage on a SQLAlchemy engine; subclasses supply the dialect-specific parts."""

    #: the driver's base exception class (errors raised on the raw cursor).
    driver_error: type[BaseException] = Exception
    #: how often a follower reads again while its watcher is up and silent (``None``:
    #: only when woken; for a probe that sees every commit by itself).
    safety_poll: float | None = None

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.safe_url = mask_url(url)
        d = engine.dialect
        self._q_get_session = Compiled(S_GET_SESSION, d)
        self._q_get_session_pk = Compiled(S_GET_SESSION_PK, d)
        self._q_lock_session = Compiled(self._lock_clause(S_GET_SESSION), d)
        self._q_set_head = Compiled(S_SET_HEAD, d)
        self._q_move_head = Compiled(S_MOVE_HEAD, d)
        self._q_insert_events = Compiled(insert_events_stmt(self._new_xact()), d)
        self._q_feed = Compiled(read_feed_stmt(), d)
        self._q_band = (
            Compiled(read_band_stmt(self._feed_barrier()), d) if self.feed_banded else None
        )
        self._q_session_ids = Compiled(S_SESSION_IDS, d)
        # For the banded feed's session ids and PostgreSQL's loads by key.
        self.session_keys = SessionKeys()
        self._watcher: ChangeWatcher | None = None
        self._async_watcher: AsyncChangeWatcher | None = None
        self._watcher_lock = threading.Lock()
        signal = self._signal()
        self._notifier = None if signal is None else Notifier(signal, name=f"eventstore-notify {self.safe_url}")
        self._q_turn_move = Compiled(S_TURN_MOVE, d)
        self._q_turn_release = Compiled(S_TURN_MOVE_RELEASE, d)
        self._q_turn_claim = Compiled(S_TURN_CLAIM, d)
        self._q_control = Compiled(S_CONTROL, d)
        self._q_control_head = Compiled(S_CONTROL_HEAD, d)
        self._q_read_payloads = Compiled(S_READ_PAYLOADS, d)
        self._q_read_asc = Compiled(S_READ_EVENTS_ASC, d)
        self._q_read_desc = Compiled(S_READ_EVENTS_DESC, d)
        self._q_event_at = Compiled(S_EVENT_AT, d)
        self._q_snapshots = Compiled(S_SNAPSHOTS_RANGE, d)
        self._q_insert_blobs = Compiled(
            self._insert_ignore(snapshot_blobs).values(digest=_P("digest"), body=_P("body")), d
        )
        self._q_upsert_snapshot = Compiled(self._upsert_snapshot(), d)
        self._q_latest: dict[tuple[int, int], Compiled] = {}
        self._q_blobs: dict[int, Compiled] = {}
        self._q_ordered_blobs = Compiled(_ordered_blobs(), d)
        self._sealed_queries()

    def _compile(self, stmt: Any) -> Compiled:
        return Compiled(stmt, self.engine.dialect)

    def _session_row(self, r: Any) -> SessionRow:
        return session_row(r)

    # -- dialect hooks ------------------------------------------------------------------

    def _classify(self, orig: BaseException | None, invalidated: bool) -> ErrorKind:
        """Decide what a driver error means (per dialect)."""
        raise NotImplementedError

    def _begin_write(self, conn: Connection) -> None:
        """Mark a connection so that its next BEGIN takes the write lock (SQLite)."""

    def _lock_clause(self, stmt: Any) -> Any:
        """Add row locking to a SELECT (PostgreSQL: FOR UPDATE)."""
        return stmt

    def _insert(self, table: Any) -> Any:
        """The dialect's INSERT with ON CONFLICT (PostgreSQL and SQLite spell it alike)."""
        raise NotImplementedError

    def _insert_ignore(self, table: Any) -> Any:
        """An INSERT that skips rows whose key exists."""
        return self._insert(table).on_conflict_do_nothing()

    def _upsert_snapshot(self) -> Any:
        """An INSERT into snapshots that replaces a row with the same key."""
        stmt = self._insert(snapshots)
        return stmt.on_conflict_do_update(
            index_elements=[snapshots.c.session_pk, snapshots.c.version],
            set_={
                "reducer_version": stmt.excluded.reducer_version,
                "rest": stmt.excluded.rest,
                "message_digests": stmt.excluded.message_digests,
            },
        )

    def _new_xact(self) -> Any:
        """The feed number of an inserted event, as a SQL expression over its bound
        ``session_pk`` and ``version`` (see ``eventstore/core/feed_rules.py``)."""
        raise NotImplementedError

    def _feed_barrier(self) -> Any:
        """A banded feed's barrier, as a SQL expression (see :meth:`read_band`)."""
        raise NotImplementedError

    def _probe(self) -> Probe:
        """How this backend notices commits (for :meth:`watcher`)."""
        raise NotImplementedError

    def _async_probe(self) -> AsyncProbe:
        """The same, awaited on an event loop (for :meth:`async_watcher`)."""
        raise NotImplementedError

    def _signal(self) -> Signal | None:
        """How this backend tells other processes about commits (``None``: its probe
        sees them by itself)."""
        return None

    def _committed(self) -> None:
        """A write transaction committed: wake the followers of every process.

        Every write path calls it after its commit, never inside the transaction. This
        store's own followers are woken at once; other stores' (other processes') by the
        notifier's sign, or by their own probe.
        """
        watcher, async_watcher = self._watcher, self._async_watcher
        if watcher is not None:
            watcher.wake()
        if async_watcher is not None:
            async_watcher.wake()
        if self._notifier is not None:
            self._notifier.mark()

    def _migration_lock(self, conn: Connection) -> None:
        """Serialise concurrent migrations (PostgreSQL: an advisory lock)."""

    def _lock_snapshot_writes(self, tx: Tx) -> None:
        """Block snapshot writes until the transaction ends (SQLite: BEGIN IMMEDIATE did)."""

    def _migration_options(self, conn: Connection) -> dict[str, Any]:
        """Options of :func:`~eventstore.storage.migrate.upgrade` (PostgreSQL: partitions)."""
        return {}

    # -- the one error mapper -----------------------------------------------------------

    @contextmanager
    def _errors(self, *, session: str | None = None, expected: int | None = None) -> Iterator[None]:
        """Turn every driver exception raised inside the block into the error tree."""
        try:
            yield
        except EventStoreError:
            raise
        except (DBAPIError, self.driver_error) as exc:
            orig: BaseException | None
            if isinstance(exc, DBAPIError):
                orig, invalidated = exc.orig, exc.connection_invalidated
            else:  # raised on the raw cursor of a hot statement
                orig, invalidated = exc, False
            kind = self._classify(orig, invalidated)
            if kind is ErrorKind.VERSION_TAKEN:
                actual = self._peek_head(session) if session is not None else -1
                raise ConcurrencyError(
                    session or "?", -1 if expected is None else expected, actual
                ) from exc
            if kind is ErrorKind.EVENT_ID_TAKEN:
                raise EventIdRace() from exc
            if kind is ErrorKind.NO_SCHEMA:
                raise SchemaError(
                    f"the database {self.safe_url} has no eventstore schema "
                    f"({_first_line(orig)}); run `eventstore migrate`"
                ) from exc
            if kind is ErrorKind.RETRYABLE:
                raise StorageError(
                    f"database {self.safe_url} is unavailable or busy: {_first_line(orig)}; "
                    "try again",
                    retryable=True,
                ) from exc
            raise StorageError(
                f"database {self.safe_url} failed: {_first_line(orig)}", retryable=False
            ) from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"database {self.safe_url} failed: {exc}") from exc

    def _peek_head(self, session: str) -> int:
        try:
            with self.engine.connect() as conn:
                head = conn.execute(
                    select(sessions.c.head).where(sessions.c.id == session)
                ).scalar()
            return int(head or 0)
        except SQLAlchemyError:
            return -1

    # -- raw execution of compiled statements -------------------------------------------

    @staticmethod
    def _run(tx: Tx, q: Compiled, params: Mapping[str, Any]) -> Any:
        cur = tx.connection.cursor()
        cur.execute(q.sql, q.args(params))
        return cur

    @staticmethod
    def _fetchall(tx: Tx, q: Compiled, params: Mapping[str, Any]) -> list[Any]:
        cur = tx.connection.cursor()
        try:
            cur.execute(q.sql, q.args(params))
            return list(cur.fetchall())
        finally:
            cur.close()

    @staticmethod
    def _fetchone(tx: Tx, q: Compiled, params: Mapping[str, Any]) -> Any:
        cur = tx.connection.cursor()
        try:
            cur.execute(q.sql, q.args(params))
            return cur.fetchone()
        finally:
            cur.close()

    @staticmethod
    def _runmany(tx: Tx, q: Compiled, seq: Sequence[Mapping[str, Any]]) -> None:
        cur = tx.connection.cursor()
        try:
            cur.executemany(q.sql, [q.args(p) for p in seq])
        finally:
            cur.close()

    def fetch_all(self, key: Any, stmt: Any, params: Mapping[str, Any]) -> list[Any]:
        """Every row of one read-only Core statement, run on its own (one snapshot).
        ``key`` names the statement's shape (PostgreSQL caches its compiled form by it)."""
        with self.read() as tx:
            return list(tx.execute(stmt, dict(params)).all())

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[Tx]:
        with self._errors(), self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def write(self, *, session: str | None = None, expected: int | None = None) -> Iterator[Tx]:
        with self._errors(session=session, expected=expected), self.engine.connect() as conn:
            self._begin_write(conn)
            with conn.begin():
                yield conn
        self._committed()

    def close(self) -> None:
        if self._notifier is not None:
            self._notifier.close()
        with self._watcher_lock:
            w, self._watcher = self._watcher, None
            aw, self._async_watcher = self._async_watcher, None
        if w is not None:
            w.close()
        if aw is not None:
            # An async storage is closed from the greenlet of its facade's close().
            await_only(aw.close())
        self.engine.dispose()

    # -- schema -------------------------------------------------------------------------

    def migrate(self) -> None:
        from eventstore.storage.migrate import upgrade

        with self._errors(), self.engine.connect() as conn:
            self._begin_write(conn)
            with conn.begin():
                self._migration_lock(conn)
                upgrade(conn, **self._migration_options(conn))

    def schema_revision(self) -> str | None:
        with self._errors(), self.engine.connect() as conn:
            if not inspect(conn).has_table(VERSION_TABLE):
                return None
            rev = conn.exec_driver_sql(
                # A constant identifier from schema.py, not user input.
                "SELECT version_num FROM " + VERSION_TABLE
            ).scalar()
            return None if rev is None else str(rev)

    # -- sessions -----------------------------------------------------------------------

    def get_session(self, tx: Tx, session_id: str) -> SessionRow | None:
        r = self._fetchone(tx, self._q_get_session, {"id": session_id})
        return None if r is None else session_row(r)

    def get_session_by_pk(self, tx: Tx, pk: int) -> SessionRow:
        r = self._fetchone(tx, self._q_get_session_pk, {"pk": pk})
        if r is None:
            raise StorageError(f"session row {pk} vanished; run `eventstore verify`")
        return session_row(r)

    def lock_session(self, tx: Tx, session_id: str) -> SessionRow | None:
        r = self._fetchone(tx, self._q_lock_session, {"id": session_id})
        return None if r is None else session_row(r)

    def insert_session(self, tx: Tx, new: NewSession) -> SessionRow | None:
        stmt = (
            self._insert_ignore(sessions)
            .values(
                id=new.id,
                parent_pk=new.parent_pk,
                fork_version=new.fork_version,
                head=new.head,
                head_hash=new.head_hash,
                head_turn=new.head_turn,
                baseline=new.baseline,
                baseline_hash=new.baseline_hash,
                baseline_turn=new.baseline_turn,
                created_at=new.created_at,
                status=new.status,
                first_text=new.first_text,
                updated_at=new.created_at,
            )
            .returning(*_SESSION_COLS)
        )
        r = tx.execute(stmt).first()
        return None if r is None else session_row(r)

    def set_head(self, tx: Tx, pk: int, head: int, head_hash: bytes, head_turn: int) -> None:
        self._run(
            tx,
            self._q_set_head,
            {"p_pk": pk, "p_head": head, "p_hash": head_hash, "p_turn": head_turn},
        ).close()

    def append_at(
        self,
        tx: Tx,
        session_pk: int,
        old_head: int,
        old_hash: bytes,
        rows: Sequence[EventRow],
        head_turn: int,
        effect: CatalogueEffect | None = None,
    ) -> bool:
        cur = self._run(
            tx,
            self._q_move_head,
            {
                "p_pk": session_pk,
                "p_old_head": old_head,
                "p_old_hash": old_hash,
                "p_head": rows[-1].version,
                "p_hash": rows[-1].hash,
                "p_turn": head_turn,
                **effect_params(effect),
            },
        )
        moved = bool(cur.rowcount == 1)
        cur.close()
        if moved:
            self.insert_events(tx, rows)
        return moved

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
        with self.write() as tx:
            if not self.append_at(tx, session_pk, old_head, old_hash, rows, head_turn, effect):
                return False
            for i, snap in enumerate(snapshots):
                self.put_snapshot(tx, snap, blobs if i == 0 else {})
            return True

    def list_sessions(self, tx: Tx) -> list[SessionRow]:
        rows = tx.execute(select(*_SESSION_COLS).order_by(sessions.c.pk)).all()
        return [session_row(r) for r in rows]

    def max_child_fork(self, tx: Tx, pk: int) -> int | None:
        v = tx.execute(
            select(func.max(sessions.c.fork_version)).where(sessions.c.parent_pk == pk)
        ).scalar()
        return None if v is None else int(v)

    # -- streaming turns ------------------------------------------------------------------

    def get_control(self, tx: Tx, pk: int, *, with_head_event: bool = False) -> SessionControl:
        q = self._q_control_head if with_head_event else self._q_control
        r = self._fetchone(tx, q, {"pk": pk})
        if r is None:
            raise StorageError(f"session row {pk} vanished; run `eventstore verify`")
        return _control(r)

    def list_controls(self, tx: Tx) -> dict[int, SessionControl]:
        rows = tx.execute(_WITH_HEAD_EVENT).all()
        return {r[0]: _control(r) for r in rows}

    def set_writer(
        self, tx: Tx, pk: int, writer: str | None, seen_at: int | None, *, only_if: str | None = None
    ) -> bool:
        stmt = update(sessions).where(sessions.c.pk == pk)
        if only_if is not None:
            stmt = stmt.where(sessions.c.writer == only_if)
        return bool(tx.execute(stmt.values(writer=writer, writer_seen=seen_at)).rowcount == 1)

    def close_session(self, tx: Tx, pk: int, closed_at: int, reason: str | None) -> None:
        tx.execute(
            update(sessions).where(sessions.c.pk == pk).values(closed_at=closed_at, closed_reason=reason)
        )

    def append_batches(self, batches: Sequence[TurnBatch]) -> list[bool]:
        written: list[bool] = []
        with self.write() as tx:
            rows: list[EventRow] = []
            snaps: list[tuple[SnapshotRow, Mapping[bytes, bytes]]] = []
            for b in batches:
                last = b.rows[-1] if b.rows else None
                cur = self._run(
                    tx,
                    self._q_move_head
                    if b.writer is None
                    else self._q_turn_claim
                    if b.claim
                    else self._q_turn_release
                    if b.release
                    else self._q_turn_move,
                    {
                        "p_pk": b.session_pk,
                        "p_old_head": b.old_head,
                        "p_old_hash": b.old_hash,
                        # A claim that also releases takes the lease and gives it up at once.
                        "p_writer": None if b.claim and b.release else b.writer,
                        "p_head": b.old_head if last is None else last.version,
                        "p_hash": b.old_hash if last is None else last.hash,
                        "p_turn": b.head_turn,
                        "p_seen": None if b.claim and b.release else b.seen_at,
                        **effect_params(b.effect),
                    },
                )
                moved = bool(cur.rowcount == 1)
                cur.close()
                written.append(moved)
                if moved:
                    rows.extend(b.rows)
                    snaps.extend((n, b.blobs if i == 0 else {}) for i, n in enumerate(b.snapshots))
            if rows:
                self.insert_events(tx, rows)
            for snap, blobs in snaps:
                self.put_snapshot(tx, snap, blobs)
        return written

    # -- events -------------------------------------------------------------------------

    def insert_events(self, tx: Tx, rows: Sequence[EventRow]) -> None:
        q = self._q_insert_events
        if q.keys == _EVENT_KEYS and not q.defaults:
            # Positional (SQLite's qmark) in EventRow's field order: the tuples go straight
            # to the driver's executemany, no per-row dict.
            cur = tx.connection.cursor()
            try:
                cur.executemany(
                    q.sql,
                    [
                        (
                            r.session_pk,
                            r.version,
                            r.event_id,
                            r.type,
                            r.turn,
                            r.payload,
                            r.recorded_at,
                            r.actor,
                            r.metadata,
                            r.hash,
                            r.native,
                        )
                        for r in rows
                    ],
                )
            finally:
                cur.close()
            return
        self._runmany(
            tx,
            self._q_insert_events,
            [
                {
                    "session_pk": r.session_pk,
                    "version": r.version,
                    "event_id": r.event_id,
                    "type": r.type,
                    "turn": r.turn,
                    "payload": r.payload,
                    "recorded_at": r.recorded_at,
                    "actor": r.actor,
                    "metadata": r.metadata,
                    "hash": r.hash,
                    "native": r.native,
                }
                for r in rows
            ],
        )

    def restore_events(self, tx: Tx, rows: Sequence[EventRow], *, before: int) -> bool:
        if not rows:
            return True
        pk = rows[0].session_pk
        above = tx.execute(
            select(events.c.xact).where(events.c.session_pk == pk, events.c.version == before)
        ).scalar()
        if above is None:
            self.insert_events(tx, rows)
            return True
        below = tx.execute(
            select(func.max(events.c.xact)).where(
                events.c.session_pk == pk, events.c.version < rows[0].version
            )
        ).scalar()
        xacts = self._restore_xacts(tx, len(rows), int(below or 0), int(above))
        if xacts is None:
            return False
        # Not the hot insert: a restore is rare, and its feed numbers are given, not computed.
        tx.execute(
            insert(events),
            [{**{f: getattr(r, f) for f in _EVENT_KEYS}, "xact": x} for r, x in zip(rows, xacts)],
        )
        return True

    def _restore_xacts(self, tx: Tx, n: int, below: int, above: int) -> list[int] | None:
        """The feed numbers of ``n`` restored events of a session, ascending, between the
        number of its nearest event below them (``below``, 0: none) and of its first event
        above (``above``); ``None`` when there are none to give."""
        raise NotImplementedError

    def events_by_id(self, tx: Tx, session_pk: int, event_ids: Sequence[str]) -> list[EventRow]:
        out: list[EventRow] = []
        for chunk in self.iter_chunks(list(event_ids), _CHUNK):
            rows = tx.execute(
                select(*EVENT_COLUMNS).where(
                    events.c.session_pk == session_pk, events.c.event_id.in_(chunk)
                )
            ).all()
            out.extend(_event(r) for r in rows)
        missing = set(event_ids) - {e.event_id for e in out if e.event_id is not None}
        if missing:
            out += self._sealed_by_id(tx, session_pk, missing)
        out.sort(key=lambda e: e.version)
        return out

    def read_events(
        self,
        tx: Tx,
        session_pk: int,
        *,
        after: int,
        upto: int,
        limit: int | None = None,
        desc: bool = False,
    ) -> list[EventRow]:
        q = self._q_read_desc if desc else self._q_read_asc
        params = {
            "pk": session_pk,
            "after": after,
            "upto": upto,
            "lim": _NO_LIMIT if limit is None else limit,
        }
        rows = [_event(r) for r in self._fetchall(tx, q, params)]
        return self._merge_range(tx, session_pk, rows, after=after, upto=upto, limit=limit, desc=desc)

    def read_payloads(self, tx: Tx, session_pk: int, *, after: int, upto: int) -> list[bytes]:
        rows = self._fetchall(
            tx, self._q_read_payloads, {"pk": session_pk, "after": after, "upto": upto}
        )
        if len(rows) < upto - after:
            # Some are sealed (or missing): the merged read says which.
            return [e.payload for e in self.read_events(tx, session_pk, after=after, upto=upto)]
        return [r[0] if type(r[0]) is bytes else bytes(r[0]) for r in rows]

    def event_at(self, tx: Tx, session_pk: int, version: int) -> EventRow | None:
        r = self._fetchone(tx, self._q_event_at, {"pk": session_pk, "version": version})
        return self._sealed_event_at(tx, session_pk, version) if r is None else _event(r)

    # -- feed -------------------------------------------------------------------------------

    def feed_barrier(self, tx: Tx) -> FeedBarrier:
        return FeedBarrier(None)

    def read_feed(
        self, tx: Tx, *, after: tuple[int, int, int] | None, limit: int
    ) -> list[FeedRow]:
        x, s, v = (-1, 0, 0) if after is None else after
        params = {"x": x, "s": s, "v": v, "lim": limit}
        rows = [FeedRow._make(r) for r in self._fetchall(tx, self._q_feed, params)]
        return self._merge_feed(tx, rows, after=(x, s, v), limit=limit)

    def read_band(self, *, after: tuple[int, int, int] | None, limit: int, upto: int) -> Band:
        assert self._q_band is not None, "only a banded storage reads bands"
        with self.read() as tx:
            self._before_band(tx)
            rows = self._fetchall(tx, self._q_band, self._band_params(after, limit, upto))
            band = self._band(rows, lambda pks: self._fetchall(tx, self._q_session_ids, {"pks": pks}))
            return self._sealed_band(tx, band, after, limit, upto)

    def _sealed_band(
        self, tx: Tx, band: Band, after: tuple[int, int, int] | None, limit: int, upto: int
    ) -> Band:
        """A band with the sealed events of its range merged in (read in ``tx``)."""
        key = (-1, 0, 0) if after is None else after
        rows = self._merge_feed(tx, band.rows, after=key, limit=limit, top=min(upto, band.below - 1))
        return band if rows is band.rows else Band(band.below, rows, band.pending)

    @staticmethod
    def _band_params(after: tuple[int, int, int] | None, limit: int, upto: int) -> dict[str, int]:
        x, s, v = (-1, 0, 0) if after is None else after
        return {"x": x, "s": s, "v": v, "lim": limit, "upto": upto}

    def _band(self, rows: Sequence[Any], session_ids: Callable[[list[int]], Iterable[Any]]) -> Band:
        """A band from the rows of :func:`read_band_stmt`; ``session_ids`` reads the ids of
        sessions this storage has not seen yet (in the band's own transaction)."""
        # The barrier's row is there even when the band is empty.
        below, pending = int(rows[0][-2]), bool(rows[0][-1])
        if rows[0][0] is None:
            return Band(below, [], pending)
        make, name = FeedRow._make, self.session_keys.session_id
        try:
            return Band(below, [make((*r[:-3], name(r[0]), r[-3])) for r in rows], pending)
        except KeyError:
            found = dict(session_ids(list({r[0] for r in rows})))
            for pk, session_id in found.items():
                self.session_keys.learn(session_id, pk)
            return Band(below, [make((*r[:-3], found[r[0]], r[-3])) for r in rows], pending)

    def _before_band(self, tx: Tx) -> None:
        """Settings a band's statement needs in its transaction (none by default)."""

    def watcher(self) -> ChangeWatcher:
        with self._watcher_lock:
            if self._watcher is None:
                self._watcher = ThreadWatcher(
                    self._probe(), name=f"eventstore-watch {self.safe_url}", safety_poll=self.safety_poll
                )
            return self._watcher

    def async_watcher(self) -> AsyncChangeWatcher:
        with self._watcher_lock:
            if self._async_watcher is None:
                self._async_watcher = TaskWatcher(self._async_probe(), safety_poll=self.safety_poll)
            return self._async_watcher

    # -- snapshots ----------------------------------------------------------------------

    def _latest_query(self, n_segments: int, n_baselines: int) -> Compiled:
        """The newest-usable-snapshot query for a lineage shape, compiled once per shape."""
        key = (n_segments, n_baselines)
        q = self._q_latest.get(key)
        if q is None:
            at_baseline = [
                and_(snapshots.c.session_pk == _P(f"bpk{i}"), snapshots.c.version == _P(f"bv{i}"))
                for i in range(n_baselines)
            ]
            usable = or_(snapshots.c.reducer_version == _P("rv"), *at_baseline)
            # A snapshot *at* a segment's lower end is the state of the previous segment's
            # tip, so it is as good as one inside: `version >= after` (but never version 0).
            within = or_(
                *(
                    and_(
                        snapshots.c.session_pk == _P(f"spk{i}"),
                        snapshots.c.version > 0,
                        snapshots.c.version >= _P(f"sa{i}"),
                        snapshots.c.version <= _P(f"su{i}"),
                    )
                    for i in range(n_segments)
                ),
                *at_baseline,
            )
            stmt = (
                select(*_SNAPSHOT_COLS)
                .where(within, usable)
                .order_by(snapshots.c.version.desc())
                .limit(1)
            )
            q = self._q_latest[key] = Compiled(stmt, self.engine.dialect)
        return q

    def latest_snapshot(
        self,
        tx: Tx,
        segments: Sequence[Segment],
        reducer_version: int,
        baselines: Sequence[tuple[int, int]] = (),
    ) -> SnapshotRow | None:
        if not segments and not baselines:
            return None
        params: dict[str, Any] = {"rv": reducer_version}
        for i, s in enumerate(segments):
            params[f"spk{i}"], params[f"sa{i}"], params[f"su{i}"] = s.session_pk, s.after, s.upto
        for i, (pk, v) in enumerate(baselines):
            params[f"bpk{i}"], params[f"bv{i}"] = pk, v
        r = self._fetchone(tx, self._latest_query(len(segments), len(baselines)), params)
        return None if r is None else _snapshot(r)

    def list_snapshots(
        self, tx: Tx, session_pk: int, *, after: int, upto: int
    ) -> list[SnapshotRow]:
        rows = self._fetchall(
            tx, self._q_snapshots, {"pk": session_pk, "after": after, "upto": upto}
        )
        return [_snapshot(r) for r in rows]

    def put_snapshot(self, tx: Tx, snap: SnapshotRow, blobs: Mapping[bytes, bytes]) -> None:
        if blobs:
            self._runmany(
                tx, self._q_insert_blobs, [{"digest": d, "body": b} for d, b in blobs.items()]
            )
        self._run(
            tx,
            self._q_upsert_snapshot,
            {
                "session_pk": snap.session_pk,
                "version": snap.version,
                "reducer_version": snap.reducer_version,
                "rest": snap.rest,
                "message_digests": snap.message_digests,
            },
        ).close()

    def _blobs_query(self, n: int) -> Compiled:
        q = self._q_blobs.get(n)
        if q is None:
            stmt = select(snapshot_blobs.c.digest, snapshot_blobs.c.body).where(
                snapshot_blobs.c.digest.in_([_P(f"d{i}") for i in range(n)])
            )
            q = self._q_blobs[n] = Compiled(stmt, self.engine.dialect)
        return q

    def get_blobs(self, tx: Tx, digests: Sequence[bytes]) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        unique = list(dict.fromkeys(digests))
        for chunk in self.iter_chunks(unique, _CHUNK):
            # Pad to a power of two so that only a handful of statement shapes exist.
            n = 1 << max(0, len(chunk) - 1).bit_length()
            padded = list(chunk) + [chunk[0]] * (n - len(chunk))
            rows = self._fetchall(
                tx, self._blobs_query(n), {f"d{i}": d for i, d in enumerate(padded)}
            )
            for d, b in rows:
                out[bytes(d)] = bytes(b)
        return out

    def ordered_bodies(self, tx: Tx, message_digests: bytes) -> list[bytes | None]:
        n = len(message_digests) // DIGEST_SIZE
        if not n:
            return []
        rows = self._fetchall(tx, self._q_ordered_blobs, {"md": message_digests, "n": n})
        return [None if b is None else b if type(b) is bytes else bytes(b) for (b,) in rows]

    def load_parts(
        self, session_id: str, version: int | None, reducer_version: int
    ) -> LoadParts | None:
        # In one read transaction: the session row, the newest usable snapshot, its
        # message bodies in snapshot order (one statement: the digests are split by a
        # recursive CTE, so no parameter list and no digest->body dict), the tail.
        with self.read() as tx:
            r = self._fetchone(tx, self._q_get_session, {"id": session_id})
            if r is None:
                return LoadParts(None)
            row = session_row(r)
            v = row.head if version is None else version
            if row.parent_pk is not None or not (row.baseline <= v <= row.head):
                return LoadParts(row)  # a branch, or a version the store refuses
            base = 0
            rest: bytes | None = None
            messages = b""
            n_digests = n_found = 0
            baselines = [(row.pk, row.baseline)] if 0 < row.baseline <= v else []
            snap = self.latest_snapshot(tx, [Segment(row.pk, 0, v)], reducer_version, baselines)
            if snap is not None:
                base, rest = snap.version, snap.rest
                ordered = self.ordered_bodies(tx, snap.message_digests)
                bodies = [b for b in ordered if b is not None]
                n_digests, n_found = len(ordered), len(bodies)
                messages = b",".join(bodies)
            payloads = self._fetchall(
                tx, self._q_read_payloads, {"pk": row.pk, "after": base, "upto": v}
            )
            sealed: tuple[tuple[int, bytes], ...] = ()
            if len(payloads) != v - base:
                # Some are sealed: their payloads are merged in by version (any other gap
                # takes the general path).
                found = self._fetchall(tx, self._q_segments, {"pk": row.pk, "after": base, "upto": v})
                sealed = self._sealed_payloads(found, base, v)
                if len(payloads) + len(sealed) != v - base:
                    return LoadParts(row)
        return LoadParts(
            row,
            complete=True,
            snap_version=base,
            rest=rest,
            messages=messages,
            n_digests=n_digests,
            n_found=n_found,
            tail=b",".join(p for (p,) in payloads),
            n_tail=len(payloads),
            sealed=sealed,
        )

    # -- compaction ---------------------------------------------------------------------

    def compact(
        self,
        tx: Tx,
        session_pk: int,
        *,
        upto: int,
        keep_upto: int,
        baseline_hash: bytes,
        baseline_turn: int,
    ) -> int:
        tx.execute(
            update(sessions)
            .where(sessions.c.pk == session_pk)
            .values(baseline=upto, baseline_hash=baseline_hash, baseline_turn=baseline_turn)
        )
        # The permit is what the DELETE trigger checks; it never outlives this transaction.
        tx.execute(insert(compaction_permits).values(session_pk=session_pk, upto=upto))
        deleted = tx.execute(
            delete(events).where(
                events.c.session_pk == session_pk,
                events.c.version > keep_upto,
                events.c.version <= upto,
            )
        ).rowcount
        tx.execute(
            delete(snapshots).where(
                snapshots.c.session_pk == session_pk,
                snapshots.c.version > keep_upto,
                snapshots.c.version < upto,
            )
        )
        tx.execute(delete(compaction_permits).where(compaction_permits.c.session_pk == session_pk))
        return int(deleted or 0) + self._cut_segments(tx, session_pk, after=keep_upto, upto=upto)


    # -- audit: compaction records, erasure, blob collection ------------------------------

    def record_compaction(
        self,
        tx: Tx,
        session_pk: int,
        *,
        upto: int,
        state_digest: bytes,
        compacted_at: int,
        actor: str | None = None,
    ) -> CompactionRow:
        row = self.get_session_by_pk(tx, session_pk)
        first = max(row.baseline, row.fork_version or 0) + 1
        found = [
            (e.version, e.hash, e.turn)
            for e in self.read_events(tx, session_pk, after=first - 1, upto=upto)
        ]
        if upto < first or [r[0] for r in found] != list(range(first, upto + 1)):
            raise StorageError(
                f"cannot record a compaction of session {row.id!r} up to {upto}: its events "
                f"{first}..{upto} are not all there"
            )
        rec = CompactionRow(
            session_pk=session_pk,
            upto=upto,
            previous_baseline=row.baseline,
            baseline_hash=bytes(found[-1][1]),
            baseline_turn=int(found[-1][2]),
            state_digest=bytes(state_digest),
            first_version=first,
            removed_hashes=b"".join(bytes(r[1]) for r in found),
            compacted_at=compacted_at,
            actor=actor,
        )
        self.insert_compaction(tx, rec)
        return rec

    def insert_compaction(self, tx: Tx, rec: CompactionRow) -> None:
        tx.execute(insert(compactions).values(**_fields(rec)))

    def list_compactions(self, tx: Tx, session_pk: int) -> list[CompactionRow]:
        rows = tx.execute(
            select(*compactions.c)
            .where(compactions.c.session_pk == session_pk)
            .order_by(compactions.c.upto)
        ).mappings()
        return [_compaction(r) for r in rows]

    def recorded_hash(self, tx: Tx, session_pk: int, version: int) -> bytes | None:
        ev = self.event_at(tx, session_pk, version)
        if ev is not None:
            return ev.hash
        for rec in self.list_compactions(tx, session_pk):
            h = rec.hash_at(version)
            if h is not None:
                return h
        return None

    def descendants(self, tx: Tx, pk: int) -> list[SessionRow]:
        out: list[SessionRow] = []
        frontier = [pk]
        while frontier:
            children: list[SessionRow] = []
            for chunk in self.iter_chunks(frontier, _CHUNK):
                rows = tx.execute(
                    select(*_SESSION_COLS)
                    .where(sessions.c.parent_pk.in_(list(chunk)))
                    .order_by(sessions.c.pk)
                ).all()
                children.extend(session_row(r) for r in rows)
            out.extend(children)
            frontier = [c.pk for c in children]
        return out

    def erase_session(
        self,
        tx: Tx,
        session_pk: int,
        *,
        erased_at: int,
        actor: str | None,
        reason: str,
    ) -> Erasure:
        root = self.get_session_by_pk(tx, session_pk)
        family = [root, *self.descendants(tx, session_pk)]
        marks = tuple(
            TombstoneRow(
                session_id=r.id,
                head=r.head,
                head_hash=r.head_hash,
                erased_at=erased_at,
                actor=actor,
                reason=reason,
                erased_with=None if r.pk == root.pk else root.id,
            )
            for r in family
        )
        tx.execute(insert(tombstones), [_fields(t) for t in marks])
        pks = [r.pk for r in family]
        released: set[bytes] = set()
        n_events = n_snapshots = 0
        # The permits are what the DELETE trigger checks; none outlives this call.
        tx.execute(
            insert(compaction_permits),
            [{"session_pk": pk, "upto": _ALL_VERSIONS} for pk in pks],
        )
        for chunk in self.iter_chunks(pks, _CHUNK):
            in_chunk = list(chunk)
            for (md,) in tx.execute(
                select(snapshots.c.message_digests).where(snapshots.c.session_pk.in_(in_chunk))
            ):
                released.update(_split_digests(bytes(md)))
            n_events += tx.execute(delete(events).where(events.c.session_pk.in_(in_chunk))).rowcount
            n_events += self._drop_segments(tx, in_chunk)
            n_snapshots += tx.execute(
                delete(snapshots).where(snapshots.c.session_pk.in_(in_chunk))
            ).rowcount
            tx.execute(delete(compactions).where(compactions.c.session_pk.in_(in_chunk)))
            forget_info(tx, in_chunk)
        # Children before parents: a branch row refers to its parent's.
        for chunk in self.iter_chunks(pks[::-1], _CHUNK):
            tx.execute(delete(sessions).where(sessions.c.pk.in_(list(chunk))))
        for chunk in self.iter_chunks(pks, _CHUNK):
            tx.execute(
                delete(compaction_permits).where(compaction_permits.c.session_pk.in_(list(chunk)))
            )
        return Erasure(marks, int(n_events), int(n_snapshots), frozenset(released))

    def get_tombstone(self, tx: Tx, session_id: str) -> TombstoneRow | None:
        r = tx.execute(
            select(*tombstones.c).where(tombstones.c.session_id == session_id)
        ).mappings().first()
        return None if r is None else _tombstone(r)

    def list_tombstones(self, tx: Tx) -> list[TombstoneRow]:
        rows = tx.execute(select(*tombstones.c).order_by(tombstones.c.session_id)).mappings()
        return [_tombstone(r) for r in rows]

    def rewind_session(self, tx: Tx, rec: RewindRow, new: NewSession, closed_at: int, reason: str) -> SessionRow:
        keep_line(tx, rec.kept_pk, rec.kept_id, closed_at, reason)
        row = self.insert_session(tx, new)
        if row is None:
            raise StorageError(f"session id {new.id!r} is taken; it cannot take the rewound session")
        mark_line(tx, rec.kept_pk, row.pk)
        record_rewind(tx, dataclasses.replace(rec, new_pk=row.pk))
        return row

    def restore_rewind(self, tx: Tx, rec: RewindRow, closed_at: int, reason: str) -> None:
        keep_line(tx, rec.kept_pk, rec.kept_id, closed_at, reason)
        mark_line(tx, rec.kept_pk, rec.new_pk)
        record_rewind(tx, rec)

    def list_rewinds(
        self, tx: Tx, *, session_id: str | None = None, pks: Collection[int] | None = None
    ) -> list[RewindRow]:
        return select_rewinds(tx, session_id=session_id, pks=pks)

    def collect_blobs(self, tx: Tx, candidates: Iterable[bytes] | None = None) -> int:
        self._lock_snapshot_writes(tx)
        if candidates is None:
            unused = {bytes(d) for (d,) in tx.execute(select(snapshot_blobs.c.digest))}
        else:
            unused = {bytes(d) for d in candidates}
        if not unused:
            return 0
        for (md,) in tx.execute(select(snapshots.c.message_digests)):
            unused.difference_update(_split_digests(bytes(md)))
            if not unused:
                return 0
        deleted = 0
        for chunk in self.iter_chunks(sorted(unused), _CHUNK):
            deleted += tx.execute(
                delete(snapshot_blobs).where(snapshot_blobs.c.digest.in_(list(chunk)))
            ).rowcount
        return int(deleted)


def _split_digests(message_digests: bytes) -> list[bytes]:
    n = DIGEST_SIZE
    return [message_digests[i : i + n] for i in range(0, len(message_digests), n)]


def _fields(record: Any) -> dict[str, Any]:
    """A storage record's fields by name (they are the table's column names)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _compaction(r: Any) -> CompactionRow:
    return CompactionRow(
        session_pk=r["session_pk"],
        upto=r["upto"],
        previous_baseline=r["previous_baseline"],
        baseline_hash=bytes(r["baseline_hash"]),
        baseline_turn=r["baseline_turn"],
        state_digest=bytes(r["state_digest"]),
        first_version=r["first_version"],
        removed_hashes=bytes(r["removed_hashes"]),
        compacted_at=r["compacted_at"],
        actor=r["actor"],
    )


def _tombstone(r: Any) -> TombstoneRow:
    return TombstoneRow(
        session_id=r["session_id"],
        head=r["head"],
        head_hash=bytes(r["head_hash"]),
        erased_at=r["erased_at"],
        actor=r["actor"],
        reason=r["reason"],
        erased_with=r["erased_with"],
    )


def _first_line(exc: BaseException | None) -> str:
    text = str(exc) if exc is not None else ""
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
