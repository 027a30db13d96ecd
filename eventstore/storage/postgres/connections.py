"""How PostgreSQL's storage takes connections from its one pool (SQLAlchemy's): the
liveness rule of every checkout, and the one-statement appends and loads run in autocommit
on a pooled connection."""

from __future__ import annotations

import select as _select
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.util import await_

from eventstore.errors import StorageError
from eventstore.storage.postgres.driver_errors import classify
from eventstore.storage.sql import Compiled, ErrorKind, SqlStorage

__all__ = ["Connections", "on_checkin", "on_reset"]


_CHECKED_IN = "eventstore_checked_in"
# The psycopg cursor a pooled connection's one-statement calls reuse (see _cursor).
_CURSOR = "eventstore_cursor"
_IDLE = psycopg.pq.TransactionStatus.IDLE


def on_checkin(_dbapi_conn: Any, record: Any) -> None:
    if record is not None:
        record.info[_CHECKED_IN] = time.monotonic()


def on_reset(dbapi_conn: Any, record: Any, state: Any) -> None:
    """The pool's reset on return (its own, ``reset_on_return``, is off): roll back only a
    connection not idle. psycopg sends nothing for an idle one either, but the async
    driver's rollback still goes through the event loop, on every return."""
    if state.asyncio_safe and not state.transaction_was_reset:
        if record is None or record.driver_connection.pgconn.transaction_status != _IDLE:
            dbapi_conn.rollback()


def _readable(dbapi_conn: Any) -> bool:
    """Whether an idle connection's socket has input (EOF or an unsolicited message)."""
    try:
        r, _, _ = _select.select([dbapi_conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(r)


def _cursor(entry: Any, pg: Any) -> Any:
    """The cursor of a pooled connection's one-statement calls, made once per connection.

    A new psycopg cursor per statement builds its adapters and state every time: ~6 µs of
    client CPU a call in a loop, ~70 µs when the call finds the CPU's caches cold (a
    session's first load after the process did other work). Reused, it is reset to what a
    new one would be; it keeps its last result until the next statement replaces it.
    """
    cur = entry.info.get(_CURSOR)
    if cur is None or cur.connection is not pg or cur.closed:
        cur = entry.info[_CURSOR] = pg.cursor()
    else:
        cur.row_factory = pg.row_factory
    return cur


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

    @property
    def row_factory(self) -> Any:
        return self._cur.row_factory

    @row_factory.setter
    def row_factory(self, factory: Any) -> None:
        self._cur.row_factory = factory

    def execute(self, query: str, params: Any = None, **options: Any) -> _AwaitedCursor:
        await_(self._cur.execute(query, params, **options))
        return self

    def fetchone(self) -> Any:
        return await_(self._cur.fetchone())

    def fetchall(self) -> Any:
        return await_(self._cur.fetchall())

    def nextset(self) -> bool | None:
        return bool(self._cur.nextset())  # the results are all in: no I/O


class Connections(SqlStorage):
    """PostgreSQL's connections, all from the engine's pool: the liveness rule of its
    checkouts, and one-statement calls in autocommit (set up by ``PostgresStorage.__init__``)."""

    _asyncio: bool
    _prepare_load: bool
    _q_shapes: dict[Any, Compiled]
    _ping_after: float
    _suspect_before: float
    _closed: bool

    def _on_checkout(self, dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        """A transaction's checkout: ping the connection (a dead one raises
        ``DisconnectionError``: the pool discards it and checks out a fresh one), and take
        it out of the autocommit a one-statement call left it in (no round trip)."""
        since = record.info.get(_CHECKED_IN)
        if since is not None:  # else just connected
            self._check_alive(dbapi_conn, record, since, hot=False)
        if dbapi_conn.autocommit:
            dbapi_conn.autocommit = False

    def _check_alive(self, dbapi_conn: Any, record: Any, since: float, *, hot: bool) -> None:
        """Liveness check of a connection checked in at ``since``; ``DisconnectionError``
        when it is dead.

        Every checkout is pinged (one round trip), except a hot one-statement call's
        (:meth:`_autocommit`): its connection is pinged only when it is suspect — idle in
        the pool longer than ``ping_after_idle_s`` (HikariCP's alive-bypass window), its
        socket has something to read (the server closed it or sent a FATAL message while it
        sat idle: terminated backend, restart, crash), or a connection failed since it was
        checked in.

        Why not skip the ping for reads too: a backend killed a moment before the checkout
        may not have closed its socket yet, and then the first statement fails. A read would
        surface that as an error although nothing was wrong with the session; an append can
        fail that way mid-flight anyway (retryable ``StorageError``), so its hot loop takes
        the bypass and every other call keeps the silent replacement.
        """
        if dbapi_conn.closed or dbapi_conn.broken:
            raise DisconnectionError("the pooled connection is closed")
        if (
            hot
            and time.monotonic() - since <= self._ping_after
            and since > self._suspect_before
            and not _readable(record.driver_connection)
        ):
            return
        try:
            self.engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:  # noqa: BLE001 - any failure: replace the connection
            raise DisconnectionError(f"the pooled connection is dead: {exc}") from exc

    def _take(self, *, hot: bool) -> Any:
        """A pool entry whose connection is alive and in autocommit, for one statement.

        Taken from the engine's pool below its checkout: the entry itself, without the
        proxy, weak reference and events a checkout adds and its return undoes (on a
        loaded machine about 15 µs of client CPU a statement, against 5 for the entry
        alone). The pool's own ``_do_get`` is the hook its subclasses implement: it waits
        (the async engine's pool serves waiting tasks in turn) and opens a new connection
        within ``pool_size + max_overflow``; ``get_connection`` reopens an invalidated one.
        """
        entry = self.engine.pool._do_get()
        try:
            dbapi_conn = entry.get_connection()
            since = entry.info.get(_CHECKED_IN)
            if since is not None:  # else just connected
                try:
                    self._check_alive(dbapi_conn, entry, since, hot=hot)
                except DisconnectionError as exc:
                    entry.invalidate(exc)
                    dbapi_conn = entry.get_connection()  # a fresh one
            if not dbapi_conn.autocommit:
                dbapi_conn.autocommit = True
        except BaseException as exc:
            entry._checkin_failed(exc, _fairy_was_created=False)
            raise
        return entry

    @contextmanager
    def _autocommit(self, *, hot: bool) -> Iterator[Any]:
        """A psycopg cursor in autocommit on a pooled connection, for one statement (its
        ``row_factory`` settable: ``namedtuple_row`` names the rows by the result's columns).

        A single statement is atomic and sees one snapshot of the database: autocommit
        spares the BEGIN and COMMIT round trips; switching it costs no round trip, and a
        connection stays in it until a transaction checks it out. ``hot``: take the
        connection without the ping unless it is suspect (see :meth:`_check_alive`).

        Raises:
            StorageError: the store was closed.
        """
        if self._closed:
            raise StorageError("the store is closed", retryable=False)
        entry = self._take(hot=hot)
        pg: Any = entry.driver_connection
        keep = False
        try:
            if self._closed:  # while this call waited for its connection
                raise StorageError("the store is closed", retryable=False)
            # A psycopg cursor (binary=, %b, prepare=), awaited on the loop by the async engine.
            if self._asyncio:
                with _AwaitedCursor(pg.cursor()) as cur:
                    yield cur
            else:
                yield _cursor(entry, pg)
            keep = True
        except psycopg.OperationalError:
            self._suspect_before = time.monotonic()
            raise
        except psycopg.Error:
            keep = True  # a constraint or data error: the connection itself is fine
            raise
        finally:
            self._give_back(entry, pg, keep)

    def _give_back(self, entry: Any, pg: Any, keep: bool) -> None:
        """Return a one-statement call's pool entry (its connection still in autocommit), or
        close its connection first: after a failed or cancelled statement (it may be dead,
        or hold a result not read), and once the store is closed (nothing outlives
        close()). The pool's checkin event notes when (see :func:`on_checkin`)."""
        # pgconn's status, not info's: the same value without two objects built per call.
        idle = not (pg.closed or pg.broken) and pg.pgconn.transaction_status == _IDLE
        if not (keep and idle) or self._closed:
            entry.invalidate()
        entry.checkin(_fairy_was_created=False)

    def fetch_all(self, key: Any, stmt: Any, params: Mapping[str, Any]) -> list[Any]:
        # One statement in autocommit: no BEGIN/COMMIT round trips (a catalogue page).
        q = self._q_shapes.get(key)
        if q is None:
            q = self._q_shapes.setdefault(key, Compiled(stmt, self.engine.dialect))
        with self._errors(), self._autocommit(hot=True) as cur:
            cur.execute(q.sql, q.args(params))
            return list(map(q.row._make, cur.fetchall()))

    def fetch_one(self, q: Compiled, params: Mapping[str, Any] | None = None) -> Any:
        """The first row of one compiled statement, run alone in autocommit (``None``: no row).

        For small statements outside any transaction (a server's WAL position, a replica's
        replay state): one round trip, no BEGIN/COMMIT, errors mapped as everywhere.
        """
        with self._errors(), self._autocommit(hot=True) as cur:
            cur.execute(q.sql, q.args(params or {}))
            r = cur.fetchone()
        return None if r is None else q.row._make(r)

    def close(self) -> None:
        # One-statement calls still running drop their connections as they end.
        self._closed = True
        super().close()

    def _classify(self, orig: BaseException | None, invalidated: bool) -> ErrorKind:
        kind = classify(orig, invalidated)
        if kind is ErrorKind.RETRYABLE and (
            invalidated or isinstance(orig, psycopg.OperationalError)
        ):
            # Maybe the server went away: ping every pooled connection once.
            self._suspect_before = time.monotonic()
        return kind
