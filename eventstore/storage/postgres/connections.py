"""The hot autocommit connections PostgreSQL's one-statement appends and loads run on, and pool checkouts."""

from __future__ import annotations

import asyncio
import select as _select
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.util import await_

from eventstore.errors import StorageError
from eventstore.storage.postgres.driver_errors import classify
from eventstore.storage.sql import Compiled, ErrorKind, SqlStorage

__all__ = ["Connections", "HotConnections", "SyncHotConnections", "on_checkin"]


_CHECKED_IN = "eventstore_checked_in"
_IDLE = psycopg.pq.TransactionStatus.IDLE


def on_checkin(_dbapi_conn: Any, record: Any) -> None:
    if record is not None:
        record.info[_CHECKED_IN] = time.monotonic()


def _readable(dbapi_conn: Any) -> bool:
    """Whether an idle connection's socket has input (EOF or an unsolicited message)."""
    try:
        r, _, _ = _select.select([dbapi_conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(r)


def _suspect(conn: Any, since: float, suspect_before: float, ping_after: float, ping: bool) -> bool:
    """Whether an idle hot connection, checked in at ``since`` (monotonic), must be pinged
    before use: asked to, checked in before a connection failed (``suspect_before``: the
    server may have dropped them all), idle longer than ``ping_after``, or its socket has
    input (EOF or a FATAL message) — the sync pool's checkout rule (see ``_on_checkout``)."""
    return ping or since <= suspect_before or time.monotonic() - since > ping_after or _readable(conn)


class SyncHotConnections:
    """The sync engine's autocommit connections for its one-statement appends and loads.

    The same as :class:`HotConnections` for threads: a statement on one costs its round
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
        :meth:`HotConnections.get` for the arguments).

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


class HotConnections:
    """The async engine's autocommit connections for its one-statement appends and loads.

    Used from engine code running in a greenlet (see :mod:`eventstore.engine.async_bridge`), on one event
    loop. The connections stay in autocommit, so a statement costs one awaited round trip
    and nothing else: no pool events, no autocommit switching, no reset on return (what
    the SQLAlchemy pool would add, about as much client CPU as psycopg's own work). At most
    ``size`` are open; a caller beyond that waits, and callers waiting are served in turn:
    a connection given back (or the room to open one) goes to the one that has waited
    longest, never to a task asking after it (as the async engines' pool does, see
    :mod:`eventstore.storage.sql.fair_pool`). A connection that sat idle longer than
    ``ping_after`` seconds, or whose socket has something to read, is pinged first and
    replaced when dead, as the sync pool's checkout does.
    """

    def __init__(self, connect: Any, size: int, ping_after: float) -> None:
        self._connect = connect
        self._size = size
        self._ping_after = ping_after
        self._idle: list[tuple[Any, float]] = []
        self._open = 0
        # Each gets an idle connection and when it was given back, or None: room to
        # open one, already counted in `_open`.
        self._waiters: deque[asyncio.Future[tuple[Any, float] | None]] = deque()
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
            elif self._open < self._size:
                self._open += 1
                return self._open_counted()
            else:
                handed = self._wait()
                if handed is None:
                    if self._closed:
                        raise StorageError("the store is closed", retryable=False)
                    return self._open_counted()
                conn, since = handed
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

    def put(self, conn: Any, ok: bool) -> None:
        """Return a connection; ``ok=False`` (a failed or cancelled statement) drops it."""
        if (
            ok
            and not self._closed
            and not (conn.closed or conn.broken)
            and conn.info.transaction_status == _IDLE
        ):
            self._give((conn, time.monotonic()))
        else:
            self._discard(conn)

    def _open_counted(self) -> Any:
        """A new connection, already counted in ``_open``."""
        try:
            return await_(self._connect())
        except BaseException:
            self._open -= 1
            self._give(None)
            raise

    def _wait(self) -> tuple[Any, float] | None:
        """What :meth:`_give` hands this caller, once every earlier caller was served."""
        waiter: asyncio.Future[tuple[Any, float] | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await_(waiter)
        except BaseException:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                # Handed something, then cancelled before taking it: the next one's.
                handed = waiter.result()
                if handed is None:
                    self._open -= 1
                self._give(handed)
            raise

    def _give(self, item: tuple[Any, float] | None) -> None:
        """Hand an idle connection, or ``None`` (room to open one), to the caller that has
        waited longest; with nobody waiting, the connection is kept idle."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                if item is None:
                    self._open += 1
                waiter.set_result(item)
                return
        if item is not None:
            self._idle.append(item)

    def _discard(self, conn: Any) -> None:
        self._open -= 1
        self._give(None)  # before the close awaits: nobody asking later takes the room
        try:
            await_(conn.close())
        except psycopg.Error:
            pass

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
    """PostgreSQL's connections: the hot ones in autocommit for one-statement calls, and
    the liveness rule of the pool's checkouts (set up by ``PostgresStorage.__init__``)."""

    _hot_pool: HotConnections | SyncHotConnections
    _asyncio: bool
    _prepare_load: bool
    _q_shapes: dict[Any, Compiled]
    _ping_after: float
    _suspect_before: float
    _hot: threading.local

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

    @contextmanager
    def _autocommit(self, *, hot: bool) -> Iterator[Any]:
        """A psycopg cursor in autocommit, for one statement (its ``row_factory`` settable:
        ``namedtuple_row`` names the rows by the result's columns).

        A single statement is atomic and sees one snapshot of the database: autocommit
        spares the BEGIN and COMMIT round trips. It runs on a hot connection (see
        :class:`SyncHotConnections`), or, when every one is in use, on a pooled one with no
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

    def _classify(self, orig: BaseException | None, invalidated: bool) -> ErrorKind:
        kind = classify(orig, invalidated)
        if kind is ErrorKind.RETRYABLE and (
            invalidated or isinstance(orig, psycopg.OperationalError)
        ):
            # Maybe the server went away: ping every pooled connection once.
            self._suspect_before = time.monotonic()
        return kind
