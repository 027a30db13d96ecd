"""SqlStorage's foundation: its compiled statements, transactions, dialect hooks and the one error mapper."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, column, inspect, select, table
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.util import await_only

from eventstore.core.rows import FeedRow, SessionRow
from eventstore.errors import ConcurrencyError, EventStoreError, SchemaError, StorageError
from eventstore.storage.interface import AsyncChangeWatcher, ChangeWatcher, EventIdRace, Storage, Tx
from eventstore.storage.schema import VERSION_TABLE, sessions, snapshot_blobs, snapshots
from eventstore.storage.sql.sealed import Sealing
from eventstore.storage.sql.session_keys import SessionKeys
from eventstore.storage.sql.statements import (
    S_ADD_BLOB_REFS,
    S_CONTROL,
    S_CONTROL_HEAD,
    S_EVENT_AT,
    S_GET_SESSION,
    S_GET_SESSION_PK,
    S_MOVE_HEAD,
    S_READ_EVENTS_ASC,
    S_READ_EVENTS_DESC,
    S_READ_PAYLOADS,
    S_SESSION_IDS,
    S_SET_HEAD,
    S_SNAPSHOT_DIGESTS,
    S_SNAPSHOTS_RANGE,
    S_TURN_CLAIM,
    S_TURN_MOVE,
    S_TURN_MOVE_RELEASE,
    Compiled,
    compiled,
    insert_events_stmt,
    ordered_blobs_stmt,
    read_band_stmt,
    read_feed_stmt,
    session_row,
    upsert_snapshot,
)
from eventstore.storage.urls import mask_url
from eventstore.storage.watch import AsyncProbe, Notifier, Probe, Signal

__all__ = ["ErrorKind", "SqlTransactions"]

_P = bindparam


class ErrorKind(enum.Enum):
    """What a driver error means to eventstore (decided per dialect)."""

    VERSION_TAKEN = "version-taken"  # unique violation on the events primary key
    EVENT_ID_TAKEN = "event-id-taken"  # unique violation on (session_pk, event_id)
    RETRYABLE = "retryable"  # lost connection, serialization failure, busy database
    NO_SCHEMA = "no-schema"  # a table is missing: not migrated
    OTHER = "other"


# The statements of _built: (class, builder, arguments) -> statement.
_BUILT: dict[tuple[Any, ...], Any] = {}


class SqlTransactions(Sealing, Storage):
    """Storage on a SQLAlchemy engine: what every concern of :class:`SqlStorage
    <eventstore.storage.sql.storage.SqlStorage>` builds on; subclasses supply the
    dialect-specific parts."""

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
        self._q_get_session = compiled(S_GET_SESSION, d)
        self._q_get_session_pk = compiled(S_GET_SESSION_PK, d)
        self._q_lock_session = compiled(self._built(self._lock_clause, S_GET_SESSION), d)
        self._q_set_head = compiled(S_SET_HEAD, d)
        self._q_move_head = compiled(S_MOVE_HEAD, d)
        self._q_insert_events = compiled(insert_events_stmt(self._built(self._new_xact)), d)
        self._q_feed = compiled(read_feed_stmt(), d, row=FeedRow)
        self._q_band = (
            compiled(read_band_stmt(self._built(self._feed_barrier)), d) if self.feed_banded else None
        )
        self._q_session_ids = compiled(S_SESSION_IDS, d)
        # For the banded feed's session ids and PostgreSQL's loads by key.
        self.session_keys = SessionKeys()
        self._watcher: ChangeWatcher | None = None
        self._async_watcher: AsyncChangeWatcher | None = None
        self._watcher_lock = threading.Lock()
        signal = self._signal()
        self._notifier = None if signal is None else Notifier(signal, name=f"eventstore-notify {self.safe_url}")
        self._q_turn_move = compiled(S_TURN_MOVE, d)
        self._q_turn_release = compiled(S_TURN_MOVE_RELEASE, d)
        self._q_turn_claim = compiled(S_TURN_CLAIM, d)
        self._q_control = compiled(S_CONTROL, d)
        self._q_control_head = compiled(S_CONTROL_HEAD, d)
        self._q_read_payloads = compiled(S_READ_PAYLOADS, d)
        self._q_read_asc = compiled(S_READ_EVENTS_ASC, d)
        self._q_read_desc = compiled(S_READ_EVENTS_DESC, d)
        self._q_event_at = compiled(S_EVENT_AT, d)
        self._q_snapshots = compiled(S_SNAPSHOTS_RANGE, d)
        self._q_insert_blobs = compiled(self._built(self._upsert_blobs), d)
        self._q_add_blob_refs = compiled(S_ADD_BLOB_REFS, d)
        self._q_snapshot_digests = compiled(S_SNAPSHOT_DIGESTS, d)
        self._q_upsert_snapshot = compiled(self._built(self._upsert_snapshot), d)
        self._q_latest: dict[tuple[int, int], Compiled] = {}
        self._q_ordered_blobs = compiled(ordered_blobs_stmt(), d)
        self._sealed_queries()

    def _compile(self, stmt: Any) -> Compiled:
        return compiled(stmt, self.engine.dialect)

    def _built(self, build: Callable[..., Any], *args: Any) -> Any:
        """``build(*args)``, a statement builder of this class, built once per process per
        class and arguments: the builders read nothing of the instance, and the same
        statement object lets :func:`compiled` share its compiled form across stores."""
        key = (type(self), build.__func__, args)  # type: ignore[attr-defined]
        stmt = _BUILT.get(key)
        if stmt is None:
            stmt = _BUILT.setdefault(key, build(*args))
        return stmt

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

    def _upsert_blobs(self) -> Any:
        """An INSERT into snapshot_blobs that adds ``refs`` to a row already there.

        The conflict takes the existing row's lock, so a blob collection cannot delete it
        before this transaction ends, and one waiting to delete it sees the raised count.
        """
        stmt = self._insert(snapshot_blobs).values(
            digest=_P("digest"), body=_P("body"), refs=_P("refs")
        )
        return stmt.on_conflict_do_update(
            index_elements=[snapshot_blobs.c.digest],
            set_={"refs": snapshot_blobs.c.refs + stmt.excluded.refs},
        )

    def _upsert_snapshot(self) -> Any:
        """An INSERT into snapshots that replaces a row with the same key."""
        return upsert_snapshot(self._insert(snapshots))

    def _new_xact(self) -> Any:
        """The feed number of an inserted event, as a SQL expression over its bound
        ``session_pk`` and ``version`` (see ``eventstore/core/feed_rules.py``)."""
        raise NotImplementedError

    def _feed_barrier(self) -> Any:
        """A banded feed's barrier, as a SQL expression (see :meth:`read_feed`)."""
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

    def _migration_options(self, conn: Connection) -> dict[str, Any]:
        """Options of :func:`~eventstore.storage.migrate.upgrade` (PostgreSQL: partitions)."""
        return {}

    def _session_by_pk(self, tx: Tx, pk: int) -> SessionRow:
        """The session row with this key, which must exist (a key read from another row)."""
        row = self.session(tx, pk=pk)
        if row is None:
            raise StorageError(f"session row {pk} vanished; run `eventstore verify`")
        return row

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
        """Every row of ``q``, read by name (``q.row``)."""
        cur = tx.connection.cursor()
        try:
            cur.execute(q.sql, q.args(params))
            return list(map(q.row._make, cur.fetchall()))
        finally:
            cur.close()

    @staticmethod
    def _fetchone(tx: Tx, q: Compiled, params: Mapping[str, Any]) -> Any:
        """The first row of ``q``, read by name (``q.row``), or ``None``."""
        cur = tx.connection.cursor()
        try:
            cur.execute(q.sql, q.args(params))
            r = cur.fetchone()
            return None if r is None else q.row._make(r)
        finally:
            cur.close()

    @staticmethod
    def _fetchcolumn(tx: Tx, q: Compiled, params: Mapping[str, Any]) -> list[Any]:
        """The values of a one-column statement (its rows need no names)."""
        assert len(q.row._fields) == 1, "a statement of one column"
        cur = tx.connection.cursor()
        try:
            cur.execute(q.sql, q.args(params))
            return [r for (r,) in cur.fetchall()]
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
        with self._errors(), self.engine.connect() as conn:
            if self.dialect == "postgresql":
                # One snapshot for every statement of the read (read committed takes one
                # per statement): a seal, compaction or erasure that commits between two
                # of them is then seen whole or not at all, as on SQLite.
                conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

    def _hot_read(self) -> Any:
        """The read transaction of a load (a context manager giving a transaction whose
        ``connection`` the compiled statements run on): :meth:`read` unless a backend
        has a cheaper one."""
        return self.read()

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
            rev = conn.execute(select(column("version_num")).select_from(table(VERSION_TABLE))).scalar()
            return None if rev is None else str(rev)


def _first_line(exc: BaseException | None) -> str:
    text = str(exc) if exc is not None else ""
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
