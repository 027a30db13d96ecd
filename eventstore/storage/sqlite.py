"""SQLite: one file, WAL, ``BEGIN IMMEDIATE`` writes, immutability triggers.

pysqlite's own transaction handling issues BEGIN lazily (and only before DML), which
breaks SERIALIZABLE reads and makes a reader that later writes fail with "database is
locked" without waiting. As SQLAlchemy documents, we switch it off on connect and emit
BEGIN ourselves: ``BEGIN IMMEDIATE`` for write transactions so the write lock is taken
up front (and waited for through ``busy_timeout``), a plain ``BEGIN`` for reads.

The only SQL written as text here: those ``BEGIN`` statements (and the raw append's
``COMMIT`` / ``ROLLBACK``) and the connection's PRAGMAs (``journal_mode``, ``busy_timeout``, ``foreign_keys``, and ``data_version``,
which the change watcher polls). SQLAlchemy Core has no construct for either; every
other statement is declared with Core.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Integer, create_engine, event, func, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url

from eventstore.core.rows import TurnBatch
from eventstore.storage.schema import events, feed_clock
from eventstore.storage.sql import ErrorKind, FairAsyncQueuePool, SqlStorage
from eventstore.storage.sql.statements import inline
from eventstore.storage.watch import AsyncProbe, Probe

__all__ = [
    "SQLiteStorage",
    "VERSION_RECORDED",
    "EVENT_ID_RECORDED",
]

_WRITE = "eventstore_write"


#: Messages of revision 0002's insert triggers (the error classifier matches on them).
VERSION_RECORDED = "events are immutable: this version is already recorded"
EVENT_ID_RECORDED = "events are immutable: this event id is already recorded"


class _RawTx:
    """What the statement helpers of ``sql/`` need of a transaction: ``.connection``."""

    __slots__ = ("connection",)

    def __init__(self, connection: Any) -> None:
        self.connection = connection


#: How often the watcher asks SQLite whether another connection committed.
DATA_VERSION_POLL = 0.01


class _DataVersionProbe(Probe):
    """``PRAGMA data_version`` on a dedicated connection: it changes when any other
    connection (of any process) commits. A query of a page already in memory: cheap enough
    to ask every few milliseconds. An in-memory database has no other connection to watch:
    the probe then just reports a possible change every ``poll`` seconds."""

    def __init__(self, path: str | None, poll: float = DATA_VERSION_POLL) -> None:
        self._path = path
        self._poll = poll

    def connect(self) -> Any:
        if self._path is None:
            return None
        conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        return [conn, conn.execute("PRAGMA data_version").fetchone()[0]]

    @staticmethod
    def moved(handle: Any) -> bool:
        """Whether another connection committed since the last look."""
        if handle is None:
            return True
        v = handle[0].execute("PRAGMA data_version").fetchone()[0]
        if v == handle[1]:
            return False
        handle[1] = v
        return True

    def changed(self, handle: Any, timeout: float, stop: threading.Event) -> bool:
        end = time.monotonic() + timeout
        while True:
            if stop.wait(self._poll):
                return False
            if self.moved(handle):
                return True
            if time.monotonic() >= end:
                return False

    def close(self, handle: Any) -> None:
        if handle is not None:
            handle[0].close()


def _async_engine(url: str, echo: bool, pool_size: int) -> Engine:
    """The sync face of an aiosqlite engine: used inside a greenlet (see
    :mod:`eventstore.async_store`), each statement awaits the connection's own thread.

    aiosqlite runs every connection on a dedicated thread, so a statement that waits for
    the write lock (``busy_timeout``) blocks that thread, never the event loop.
    """
    # SQLAlchemy's asyncio layer is imported here, not at the top: the sync store (and
    # every CLI command) would pay for it at start-up without using it.
    from sqlalchemy.ext.asyncio import create_async_engine

    u = make_url(url).set(drivername="sqlite+aiosqlite")
    if u.database in (None, "", ":memory:"):
        # One connection, handed to one task at a time: the default StaticPool would
        # share it between tasks, interleaving their transactions.
        return create_async_engine(
            u, echo=echo, poolclass=FairAsyncQueuePool, pool_size=1, max_overflow=0
        ).sync_engine
    # No overflow: SQLite has one writer, and every connection is a thread of its own.
    return create_async_engine(
        u, echo=echo, poolclass=FairAsyncQueuePool, pool_size=pool_size, max_overflow=0
    ).sync_engine


class _AsyncDataVersionProbe(AsyncProbe):
    """:class:`_DataVersionProbe` on an event loop: the sleeps are awaited, and the
    ``PRAGMA`` itself (a read of the WAL index in shared memory) takes microseconds."""

    def __init__(self, path: str | None, poll: float = DATA_VERSION_POLL) -> None:
        self._sync = _DataVersionProbe(path, poll)
        self._poll = poll

    async def connect(self) -> Any:
        return self._sync.connect()

    async def changed(self, handle: Any, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while True:
            await asyncio.sleep(self._poll)
            if self._sync.moved(handle):
                return True
            if time.monotonic() >= end:
                return False

    async def close(self, handle: Any) -> None:
        self._sync.close(handle)


class SQLiteStorage(SqlStorage):
    """Storage in one SQLite file (``sqlite:///path.db``)."""

    driver_error = sqlite3.Error

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_ms: int = 30_000,
        echo: bool = False,
        pool_size: int = 5,
        use_asyncio: bool = False,
    ) -> None:
        if use_asyncio:
            engine = _async_engine(url, echo, pool_size)
        else:
            engine = create_engine(url, echo=echo, pool_size=pool_size)
        timeout = int(busy_timeout_ms)
        in_memory = engine.url.database in (None, "", ":memory:")
        self._path = None if in_memory else engine.url.database

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see module doc)
            cur = dbapi_conn.cursor()
            try:
                if not in_memory:
                    cur.execute("PRAGMA journal_mode=WAL")
                # PRAGMAs take no bound parameters; `timeout` is an int by construction.
                cur.execute("PRAGMA busy_timeout = " + str(timeout))
                cur.execute("PRAGMA foreign_keys = ON")
            finally:
                cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            write = conn.get_execution_options().get(_WRITE, False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        super().__init__(engine, url)

    def _begin_write(self, conn: Connection) -> None:
        conn.execution_options(**{_WRITE: True})

    def _new_xact(self) -> Any:
        # Writers take turns (BEGIN IMMEDIATE), so one more than any number handed out —
        # including the deleted ones feed_clock remembers — grows in commit order.
        zero, one = inline(0, Integer), inline(1, Integer)
        newest = select(func.max(events.c.xact)).scalar_subquery()
        deleted = select(feed_clock.c.xact).where(feed_clock.c.id == one).scalar_subquery()
        return func.max(func.coalesce(newest, zero), func.coalesce(deleted, zero)) + one

    def _restore_xacts(self, tx: Any, n: int, below: int, above: int) -> list[int] | None:
        # A feed number is the row's key here: no two rows share one. The free numbers
        # nearest below `above` (those the compaction freed are among them, and no insert
        # reuses a number below the newest), walked down from `above` until there are `n`.
        # Highest first, so that the lower ones stay for sessions whose first remaining
        # event is lower.
        free: list[int] = []
        top = above
        rows = tx.execute(
            select(events.c.xact)
            .where(events.c.xact > below, events.c.xact < above)
            .order_by(events.c.xact.desc())
        )
        try:
            for (x,) in rows:
                free.extend(range(top - 1, x, -1)[: n - len(free)])
                if len(free) == n:
                    break
                top = x
            else:
                free.extend(range(top - 1, below, -1)[: n - len(free)])
        finally:
            rows.close()
        return sorted(free) if len(free) == n else None

    def _probe(self) -> Probe:
        return _DataVersionProbe(self._path)

    def _async_probe(self) -> AsyncProbe:
        return _AsyncDataVersionProbe(self._path)

    def _append_fast(self, b: TurnBatch) -> bool:
        # The hot path on the pooled sqlite3 connection itself: BEGIN IMMEDIATE, the
        # checked head move, executemany of the batch, the snapshots, COMMIT — without a
        # SQLAlchemy Connection and its begin/commit events around it.
        with self._errors(), self._raw_tx("BEGIN IMMEDIATE") as (tx, cur):
            ok = self._append_plain(tx, b)
            if not ok:
                cur.execute("ROLLBACK")
        if ok:
            self._committed()
        return ok

    @contextmanager
    def _hot_read(self) -> Iterator[Any]:
        # A load's few statements on the pooled sqlite3 connection itself, in one read
        # transaction: a SQLAlchemy Connection with its begin/commit events costs more
        # CPU than the statements (about a tenth of a head load's).
        with self._errors(), self._raw_tx("BEGIN") as (tx, _):
            yield tx

    @contextmanager
    def _raw_tx(self, begin: str) -> Iterator[tuple[_RawTx, Any]]:
        """A transaction opened with ``begin`` on a pooled connection, committed when the
        block ends (unless the block ended it), rolled back when it raises."""
        fairy = self.engine.raw_connection()
        try:
            cur = fairy.cursor()
            try:
                cur.execute(begin)
                try:
                    yield _RawTx(fairy), cur
                except BaseException:
                    dbapi = fairy.driver_connection
                    if dbapi is not None and dbapi.in_transaction:
                        cur.execute("ROLLBACK")
                    raise
                if fairy.driver_connection.in_transaction:
                    cur.execute("COMMIT")
            finally:
                cur.close()
        finally:
            fairy.close()

    def _insert(self, table: Any) -> Any:
        return sqlite_insert(table)

    def _classify(self, orig: BaseException | None, invalidated: bool) -> ErrorKind:
        text = str(orig)
        if isinstance(orig, sqlite3.IntegrityError) and VERSION_RECORDED in text:
            return ErrorKind.VERSION_TAKEN
        if isinstance(orig, sqlite3.IntegrityError) and EVENT_ID_RECORDED in text:
            return ErrorKind.EVENT_ID_TAKEN
        if isinstance(orig, sqlite3.IntegrityError) and "UNIQUE constraint failed" in text:
            if "events.event_id" in text:
                return ErrorKind.EVENT_ID_TAKEN
            if "events.version" in text:
                return ErrorKind.VERSION_TAKEN
        if isinstance(orig, sqlite3.OperationalError):
            if "no such table" in text:
                return ErrorKind.NO_SCHEMA
            if "locked" in text or "busy" in text or "disk I/O" in text:
                return ErrorKind.RETRYABLE
        return ErrorKind.OTHER
