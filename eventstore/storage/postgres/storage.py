"""PostgresStorage: storage on PostgreSQL, assembled from its hot paths and its dialect's parts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, Integer, bindparam, create_engine, event, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from eventstore.core.rows import Band, FeedBarrier, SealableTurn, SealedEvent
from eventstore.errors import StorageError
from eventstore.storage.interface import Tx
from eventstore.storage.postgres.appends import HotAppends
from eventstore.storage.postgres.connections import on_checkin, on_reset
from eventstore.storage.postgres.loads import HotLoads
from eventstore.storage.postgres.notifier import AsyncListenProbe, ListenProbe, NotifySignal
from eventstore.storage.postgres.partitions import migration_options, partition_count
from eventstore.storage.postgres.statements import (
    BAND_SETTINGS,
    feed_xact,
    MIGRATION_LOCK,
    SEAL_CALL,
    feed_barrier_stmt,
    snapshot_xmin,
)
from eventstore.storage.schema import events
from eventstore.storage.sql import Compiled, FairAsyncQueuePool, compiled
from eventstore.storage.sql.statements import inline
from eventstore.storage.watch import AsyncProbe, Probe, Signal

__all__ = ["PostgresStorage"]


class _UnseenSessions(Exception):
    """A band holds events of sessions whose ids this storage has not learnt yet."""


def _unseen_sessions(pks: list[int]) -> list[Any]:
    raise _UnseenSessions


class PostgresStorage(HotAppends, HotLoads):
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
        self.partitions = partition_count(partitions, "partitions")
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
            # Done by on_reset instead: only what is not idle is rolled back.
            "pool_reset_on_return": None,
        }
        # With use_asyncio the engine is the sync face of an asyncio engine over psycopg's
        # AsyncConnection: it is used inside a greenlet (see eventstore.async_store), and
        # every round trip awaits on the event loop. Its pool hands connections to waiting
        # tasks in turn (eventstore.storage.sql.fair_pool): no task times out behind others.
        # That pool is the store's only one: transactions and the one-statement appends and
        # loads (Connections._autocommit) all take their connections from it.
        if use_asyncio:
            engine = create_async_engine(u, poolclass=FairAsyncQueuePool, **options).sync_engine
        else:
            engine = create_engine(u, **options)
        self._asyncio = use_asyncio
        # PgBouncer in transaction mode: no prepared statement at all, not even the load's.
        self._prepare_load = prepare_threshold is not None
        #: Compiled catalogue statements by shape (see :meth:`fetch_all`).
        self._q_shapes: dict[Any, Compiled] = {}
        self._ping_after = float(ping_after_idle_s)
        # Pooled connections checked in before this (monotonic) instant are suspect: a
        # connection failed since, so the server may have dropped them all.
        self._suspect_before = 0.0
        self._closed = False
        event.listen(engine, "checkin", on_checkin)
        event.listen(engine, "reset", on_reset)
        event.listen(engine, "checkout", self._on_checkout)
        super().__init__(engine, url)
        self._q_feed_barrier = compiled(feed_barrier_stmt(), engine.dialect)
        self._append_queries()
        self._load_queries()
        self._q_seal_call = compiled(SEAL_CALL, engine.dialect)

    def _migration_options(self, conn: Connection) -> dict[str, Any]:
        return migration_options(conn, self.partitions, self.safe_url)

    def _lock_clause(self, stmt: Any) -> Any:
        return stmt.with_for_update()

    def _seal_lock(self, stmt: Any, wait: bool) -> Any:
        # The background sealer skips a session an append holds and comes back later.
        return stmt.with_for_update(skip_locked=not wait)

    def _seal_barrier(self, tx: Tx) -> int | None:
        # Sealed events lie below the feed's barrier: no band reads them as pending, and no
        # transaction that could still append after them holds an older id.
        return self.feed_barrier(tx).below

    def _write_segments(
        self, tx: Tx, pk: int, done: Sequence[tuple[SealableTurn, bytes, bytes, list[SealedEvent]]]
    ) -> None:
        # The owner's function checks each range, copies end_hash and computes xact_digest
        # from the rows itself (migrations/versions/0011_seal_segments.py); the calls go
        # in one pipeline, not one round trip each.
        self._runmany(
            tx,
            self._q_seal_call,
            [{"pk": pk, "first": t.first, "last": t.last, "prev": prev, "body": body} for t, prev, body, _ in done],
        )

    def thin_snapshots(
        self, tx: Tx, session_pk: int, *, first: int, last: int, keep_every: int
    ) -> int:
        # The application role cannot delete snapshots: the owner's function does, only
        # inside sealed segments, never the baseline nor the newest, and releases their
        # blobs (migrations/versions/0012_snapshot_blob_refs.py).
        n = tx.execute(
            select(func.eventstore_thin_snapshots(session_pk, first, last, keep_every))
        ).scalar()
        return int(n or 0)

    def _new_xact(self) -> Any:
        # The column default would do for the barrier alone; raising it to the previous
        # event's keeps one session in version order when a transaction got its id before
        # another one that wrote the session's earlier versions.
        prev = events.alias("prev")
        earlier = (
            select(prev.c.xact)
            .where(
                prev.c.session_pk == bindparam("session_pk"),
                prev.c.version == bindparam("version") - inline(1, Integer),
            )
            .scalar_subquery()
        )
        return func.greatest(feed_xact(), earlier)

    def _restore_xacts(self, tx: Tx, n: int, below: int, above: int) -> list[int] | None:
        # The feed's order is (xact, session, version): with the number of the session's
        # first remaining event, the restored (lower) versions sort right before it. The
        # number is below the barrier already, so a feed past it does not see them.
        return [above] * n

    feed_banded = True

    def feed_barrier(self, tx: Tx) -> FeedBarrier:
        r = self._fetchone(tx, self._q_feed_barrier, {})
        return FeedBarrier(int(r.below), bool(r.pending))

    def _feed_barrier(self) -> Any:
        return snapshot_xmin()

    def _before_band(self, tx: Tx) -> None:
        tx.exec_driver_sql(BAND_SETTINGS)

    def _read_band(self, *, after: tuple[int, int, int] | None, limit: int, upto: int) -> Band:
        # One round trip, in autocommit: the setting and the band's statement sent as one
        # query string, which the server runs as one implicit transaction. Its values are
        # inlined (integers only) because such a string takes no parameters.
        assert self._q_band is not None
        q = self._q_band
        values = {k: int(v) for k, v in q.args(self._band_params(after, limit, upto)).items()}
        sql = f"{BAND_SETTINGS}; {q.sql % values}"
        for attempt in (1, 2):
            try:
                # Taken without the pre-ping, like an append's: a connection that died in
                # the pool just before (not yet seen as dead) fails the first attempt, and
                # the read, which changes nothing, is sent once more on a checked one.
                with self._errors(), self._autocommit(hot=True) as cur:
                    cur.row_factory = namedtuple_row
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
            return super()._read_band(after=after, limit=limit, upto=upto)
        with self.read() as tx:
            return self._sealed_band(tx, band, after, limit, upto)

    #: A notification is sent after the commit, not by it: a writer that commits without
    #: one (raw SQL, a process killed in between) is found by this slow re-read.
    safety_poll = 1.0

    def _probe(self) -> Probe:
        return ListenProbe(self.engine)

    def _signal(self) -> Signal:
        return NotifySignal(self.engine)

    def _async_probe(self) -> AsyncProbe:
        return AsyncListenProbe(self.engine)

    def _insert(self, table: Any) -> Any:
        return pg_insert(table)

    def _migration_lock(self, conn: Connection) -> None:
        conn.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK)))

