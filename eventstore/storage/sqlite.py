"""SQLite: one file, WAL, ``BEGIN IMMEDIATE`` writes, immutability triggers.

pysqlite's own transaction handling issues BEGIN lazily (and only before DML), which
breaks SERIALIZABLE reads and makes a reader that later writes fail with "database is
locked" without waiting. As SQLAlchemy documents, we switch it off on connect and emit
BEGIN ourselves: ``BEGIN IMMEDIATE`` for write transactions so the write lock is taken
up front (and waited for through ``busy_timeout``), a plain ``BEGIN`` for reads.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool

from .base import EventRow, SnapshotRow
from .sql import ErrorKind, SqlStorage

__all__ = [
    "SQLiteStorage",
    "IMMUTABILITY_DDL_V1",
    "DROP_IMMUTABILITY_DDL_V1",
    "audit_ddl_v2",
    "DROP_AUDIT_DDL_V2",
    "VERSION_RECORDED",
    "EVENT_ID_RECORDED",
]

_WRITE = "eventstore_write"

#: Triggers of revision 0001: no UPDATE ever; DELETE only under a compaction permit.
IMMUTABILITY_DDL_V1 = (
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

DROP_IMMUTABILITY_DDL_V1 = (
    "DROP TRIGGER IF EXISTS events_no_delete",
    "DROP TRIGGER IF EXISTS events_no_update",
)


#: Messages of revision 0002's insert triggers (the error classifier matches on them).
VERSION_RECORDED = "events are immutable: this version is already recorded"
EVENT_ID_RECORDED = "events are immutable: this event id is already recorded"


def audit_ddl_v2(schema: str) -> tuple[str, ...]:
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
            SELECT RAISE(ABORT, '{VERSION_RECORDED}');
        END
        """,
        f"""
        CREATE TRIGGER events_no_replace_event_id BEFORE INSERT ON events
        WHEN NEW.event_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM events e
            WHERE e.session_pk = NEW.session_pk AND e.event_id = NEW.event_id
        )
        BEGIN
            SELECT RAISE(ABORT, '{EVENT_ID_RECORDED}');
        END
        """,
    )


DROP_AUDIT_DDL_V2 = (
    "DROP TRIGGER IF EXISTS events_no_replace_event_id",
    "DROP TRIGGER IF EXISTS events_no_replace_version",
)


class _RawTx:
    """What the statement helpers of ``sql.py`` need of a transaction: ``.connection``."""

    __slots__ = ("connection",)

    def __init__(self, connection: Any) -> None:
        self.connection = connection


def _async_engine(url: str, echo: bool, pool_size: int) -> Engine:
    """The sync face of an aiosqlite engine: used inside a greenlet (see
    :mod:`eventstore.asyncstore`), each statement awaits the connection's own thread.

    aiosqlite runs every connection on a dedicated thread, so a statement that waits for
    the write lock (``busy_timeout``) blocks that thread, never the event loop.
    """
    u = make_url(url).set(drivername="sqlite+aiosqlite")
    if u.database in (None, "", ":memory:"):
        # One connection, handed to one task at a time: the default StaticPool would
        # share it between tasks, interleaving their transactions.
        return create_async_engine(
            u, echo=echo, poolclass=AsyncAdaptedQueuePool, pool_size=1, max_overflow=0
        ).sync_engine
    # No overflow: SQLite has one writer, and every connection is a thread of its own.
    return create_async_engine(u, echo=echo, pool_size=pool_size, max_overflow=0).sync_engine


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

    def append_fast(
        self,
        session_pk: int,
        old_head: int,
        old_hash: bytes,
        rows: Sequence[EventRow],
        head_turn: int,
        snapshots: Sequence[SnapshotRow],
        blobs: Mapping[bytes, bytes],
    ) -> bool:
        # The hot path on the pooled sqlite3 connection itself: BEGIN IMMEDIATE, the
        # checked head move, executemany of the batch, the snapshots, COMMIT — without a
        # SQLAlchemy Connection and its begin/commit events around it.
        with self._errors():
            fairy = self.engine.raw_connection()
            try:
                tx = _RawTx(fairy)
                cur = fairy.cursor()
                try:
                    cur.execute("BEGIN IMMEDIATE")
                    try:
                        moved = self.append_at(tx, session_pk, old_head, old_hash, rows, head_turn)
                        if moved:
                            for i, snap in enumerate(snapshots):
                                self.put_snapshot(tx, snap, blobs if i == 0 else {})
                            cur.execute("COMMIT")
                            return True
                        cur.execute("ROLLBACK")
                        return False
                    except BaseException:
                        dbapi = fairy.driver_connection
                        if dbapi is not None and dbapi.in_transaction:
                            cur.execute("ROLLBACK")
                        raise
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
