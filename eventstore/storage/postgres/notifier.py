"""How PostgreSQL stores wake followers: LISTEN probes and the pg_notify signal sent after commits."""

from __future__ import annotations

import select as _select
from typing import Any

import psycopg
from psycopg import sql as pgsql

from eventstore.storage.postgres.statements import NOTIFY, feed_channel, set_config
from eventstore.storage.postgres.summarizer import FeedIndexSummarizer
from eventstore.storage.watch import AsyncProbe, Probe, Signal

__all__ = ["ListenProbe", "AsyncListenProbe", "NotifySignal"]

_NOTIFY_SQL = NOTIFY.sql.encode()


def _dedicated(engine: Any, **settings: str) -> tuple[Any, str]:
    """A connection of its own (outside the pool, in autocommit) and this schema's
    notification channel."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    params = {"connect_timeout": 5, **cparams, "autocommit": True}
    conn = psycopg.connect(*cargs, **params)
    try:
        for name, value in settings.items():
            conn.execute(set_config(name, value))
        channel = conn.execute(feed_channel()).fetchone()
        if channel is None or channel[0] is None:
            raise RuntimeError("no events table: the database is not migrated")
    except BaseException:
        conn.close()
        raise
    return conn, str(channel[0])


class ListenProbe(Probe):
    """LISTEN on a dedicated connection (outside the pool) for the events table's channel."""

    def __init__(self, engine: Any) -> None:
        self._db = engine

    def connect(self) -> Any:
        conn, channel = _dedicated(self._db)
        try:
            # LISTEN has no SQLAlchemy construct: psycopg composes it, quoting the channel.
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


class NotifySignal(Signal):
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
        self.summarizer = FeedIndexSummarizer()

    def connect(self) -> Any:
        conn, channel = _dedicated(self._db, synchronous_commit="off")
        return conn, [str(a).encode() for a in NOTIFY.args({"channel": channel})]

    def summarize_feed_index(self, handle: Any, *, final: bool) -> None:
        """Summarize the feed index's newly complete ranges (see :class:`FeedIndexSummarizer`)."""
        self.summarizer.summarize(handle[0], final=final)

    def start(self, handle: Any) -> None:
        conn, params = handle
        conn.pgconn.send_query_params(_NOTIFY_SQL, params)

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


class AsyncListenProbe(AsyncProbe):
    """:class:`ListenProbe` on psycopg's ``AsyncConnection`` (``notifies`` awaited)."""

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

