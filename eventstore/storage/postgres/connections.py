"""How PostgreSQL's storage takes connections from its one pool (SQLAlchemy's): the
liveness rule of every checkout, and the one-statement appends and loads run in autocommit
on a pooled connection."""

from __future__ import annotations

import select as _select
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.util import await_

from eventstore.errors import StorageError
from eventstore.storage.postgres.driver_errors import classify
from eventstore.storage.sql import Compiled, ErrorKind, SqlStorage

__all__ = ["Connections", "on_checkin", "on_reset"]


_CHECKED_IN = "eventstore_checked_in"
_IDLE = psycopg.pq.TransactionStatus.IDLE
# What a checkout is for (see Connections._on_checkout): a transaction, one statement in
# autocommit, or one statement in autocommit without the pre-ping. Set around the checkout
# itself: a context variable, since an async engine's checkout may wait on the event loop
# while other tasks check theirs out on the same thread.
_TX, _ONE, _HOT = 0, 1, 2
_CHECKOUT: ContextVar[int] = ContextVar("eventstore_checkout", default=_TX)


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
        """Liveness check at checkout, without a round trip on the append hot path; and the
        connection put in autocommit for a one-statement call, out of it for a transaction.

        A connection keeps the mode of its last use while in the pool, so a run of
        one-statement calls (appends, loads) switches nothing (the async driver's switch
        goes through the event loop). Switching costs no round trip.

        Every checkout is pre-pinged (one round trip), except the one-statement calls'
        (:meth:`_autocommit` with ``hot``): their connection is pinged only when it is
        suspect — idle in the pool longer than ``ping_after_idle_s`` (HikariCP's
        alive-bypass window), its socket has something to read (the server closed it or
        sent a FATAL message while it sat idle: terminated backend, restart, crash), or a
        connection failed since it was checked in. A dead one raises
        ``DisconnectionError``: the pool discards it and checks out a fresh one.

        Why not skip the ping for reads too: a backend killed a moment before the checkout
        may not have closed its socket yet, and then the first statement fails. A read would
        surface that as an error although nothing was wrong with the session; an append can
        fail that way mid-flight anyway (retryable ``StorageError``), so its hot loop takes
        the bypass and every other call keeps the silent replacement.
        """
        kind = _CHECKOUT.get()
        since = record.info.get(_CHECKED_IN)
        if since is not None:  # else just connected
            self._check_alive(dbapi_conn, record, since, kind)
        autocommit = kind != _TX
        if dbapi_conn.autocommit != autocommit:
            dbapi_conn.autocommit = autocommit

    def _check_alive(self, dbapi_conn: Any, record: Any, since: float, kind: int) -> None:
        """Ping a connection checked in at ``since`` unless ``kind`` is a hot call's and it
        is not suspect (see :meth:`_on_checkout`); ``DisconnectionError`` when it is dead."""
        if dbapi_conn.closed or dbapi_conn.broken:
            raise DisconnectionError("the pooled connection is closed")
        if (
            kind == _HOT
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
        """A psycopg cursor in autocommit on a pooled connection, for one statement (its
        ``row_factory`` settable: ``namedtuple_row`` names the rows by the result's columns).

        A single statement is atomic and sees one snapshot of the database: autocommit
        spares the BEGIN and COMMIT round trips. The driver's connection is used with no
        SQLAlchemy ``Connection`` built around it; the checkout puts it in autocommit (see
        :meth:`_on_checkout`). ``hot``: take it without the pre-ping.

        Raises:
            StorageError: the store was closed.
        """
        if self._closed:
            raise StorageError("the store is closed", retryable=False)
        token = _CHECKOUT.set(_HOT if hot else _ONE)
        try:
            fairy = self.engine.raw_connection()
        finally:
            _CHECKOUT.reset(token)
        pg: Any = fairy.driver_connection
        keep = False
        try:
            if self._closed:  # while this call waited for its connection
                raise StorageError("the store is closed", retryable=False)
            # A psycopg cursor (binary=, %b, prepare=), awaited on the loop by the async engine.
            with _AwaitedCursor(pg.cursor()) if self._asyncio else pg.cursor() as cur:
                yield cur
            keep = True
        except psycopg.OperationalError:
            self._suspect_before = time.monotonic()
            raise
        except psycopg.Error:
            keep = True  # a constraint or data error: the connection itself is fine
            raise
        finally:
            self._give_back(fairy, pg, keep)

    def _give_back(self, fairy: Any, pg: Any, keep: bool) -> None:
        """Return a one-statement call's connection to the pool (still in autocommit), or drop
        it: after a failed or cancelled statement (it may be dead, or hold a result not
        read; returned, it would be rolled back first, which fails on a dead socket with an
        ERROR log and a traceback), and once the store is closed (nothing outlives close())."""
        # pgconn's status, not info's: the same value without two objects built per call.
        idle = not (pg.closed or pg.broken) and pg.pgconn.transaction_status == _IDLE
        if not (keep and idle) or self._closed:
            fairy.invalidate()
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
