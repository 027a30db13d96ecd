"""AsyncEventStore: the asyncio twin of :class:`~eventstore.store.EventStore`.

::

    async with AsyncEventStore("postgresql+psycopg://app@db/chat") as store:
        await store.migrate()
        await store.append("s1", [{"type": "send", "id": "u-1", "text": "hi"}], expected_version=0)
        state = await store.load("s1")
        async for event in store.history("s1"):
            ...

Every public method of ``EventStore`` has a twin here with the same name, arguments,
results and errors; ``history`` and ``replay`` are async iterators. The twin is not a
second implementation: each method calls the same engine or feature function as the sync
facade, through :func:`eventstore.engine.async_bridge.run`, over a storage opened with asyncio drivers
(psycopg's ``AsyncConnection`` on PostgreSQL, aiosqlite on SQLite). See
:mod:`eventstore.engine.async_bridge` for how the I/O awaits on the event loop.

One ``AsyncEventStore`` serves any number of tasks of one event loop; its connection pool
belongs to that loop.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import IO, Any

from eventstore.core.catalogue import InfoChange, SessionPage
from eventstore.core.checkpoints import Checkpoint
from eventstore.core.diff import SessionDiff
from eventstore.core.feed_rules import AsyncFollower, FollowState
from eventstore.core.models import Action, SessionState
from eventstore.core.records import AppendResult, RecordedEvent, Recovery, SessionInfo, VerifyReport
from eventstore.core.turn_rules import RecoveryStatus
from eventstore.core.turn_view import Turn
from eventstore.engine import catalogue, reads
from eventstore.engine import turn_recovery
from eventstore.engine.async_bridge import AsyncOpenFollowers, iterate, live, run
from eventstore.engine.async_turns import AsyncStreamingTurn, AsyncTurnWriter
from eventstore.engine.facade import StoreBase
from eventstore.engine.group_commit import AppendGroup
from eventstore.engine.turns import DEFAULT_MAX_DELAY
from eventstore.features import audit, compaction, exporting, importing, timetravel
from eventstore.features import integrity, report, rewind
from eventstore.features.compaction import CompactResult
from eventstore.features.timetravel import ReplayStep
from eventstore.features.importing import ImportResult

__all__ = ["AsyncEventStore"]


class AsyncEventStore(StoreBase):
    """Event-sourced chat sessions on SQLite or PostgreSQL, for asyncio applications.

    Takes the same arguments as :class:`~eventstore.EventStore` (the same URLs, and the
    same ``**storage_options``: ``pool_size``, ``max_overflow``, ``pool_timeout``,
    ``connect_timeout`` and ``prepare_threshold`` on PostgreSQL — ``None`` for no
    prepared statement at all, as PgBouncer's transaction mode needs — and
    ``busy_timeout_ms`` and ``pool_size`` on SQLite; ``replicas``, ``max_replica_lag``,
    ``replica_wait`` and ``partitions`` on PostgreSQL, see docs/scaling.md). Both forms may
    work on the same database at the same time. ``seal`` (default ``True``) seals closed
    turns in the background as the sync store does, in a task of the event loop the store
    runs on (started by the first append that closes a turn; :meth:`close` stops it).

    On PostgreSQL the one-statement appends and loads run on up to ``pool_size``
    connections of their own, kept in autocommit, besides the pool the transactions use.
    The store opens no connection until first used. Use it with ``async with``, or
    ``await close()``, to release its connections.

    Raises:
        StorageError: the URL is not a supported database URL.
        InvalidEvent: ``url`` is not a string, or ``snapshot_every`` or a limit is not a
            positive integer.
    """

    _asyncio_storage = True

    def _open_writers(self) -> None:
        self._streams = AsyncTurnWriter(self._engine)
        self._followers = AsyncOpenFollowers()
        self._appends = AppendGroup(self._engine)

    # -- lifecycle and schema -----------------------------------------------------------

    async def close(self) -> None:
        """Release every database connection. The store must not be used afterwards.

        Its followers end, as :meth:`EventStore.close <eventstore.EventStore.close>` says.
        """
        await self._followers.close()
        await self._streams.close()
        await self._appends.close()
        await self._engine.sealer.aclose()
        await run(self._engine.close)

    async def __aenter__(self) -> AsyncEventStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def migrate(self) -> None:
        """Twin of :meth:`EventStore.migrate <eventstore.EventStore.migrate>`."""
        await run(self._engine.migrate)

    async def check_schema(self) -> None:
        """Twin of :meth:`EventStore.check_schema <eventstore.EventStore.check_schema>`."""
        await run(self._engine.check_schema)

    # -- writes -------------------------------------------------------------------------

    async def append(
        self,
        session: str,
        actions: Iterable[Mapping[str, Any] | Action],
        *,
        expected_version: int | None = None,
        event_ids: Sequence[str] | None = None,
        actor: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        native: Sequence[Any] | None = None,
    ) -> AppendResult:
        """Twin of :meth:`EventStore.append <eventstore.EventStore.append>`: append a batch
        of actions atomically; ``ConcurrencyError`` when the head is not ``expected_version``.

        Appends of several tasks share transactions (group commit, see
        :mod:`eventstore.engine.group_commit`); each gets the result or error it would get alone."""
        req = self._engine.prepare_append(
            session,
            actions,
            expected_version=expected_version,
            event_ids=event_ids,
            actor=actor,
            metadata=metadata,
            native=native,
        )
        result = await self._appends.append(req)
        if self._engine.sealer.over_cap():
            await run(self._engine.sealer.assist)  # the backlog's bound (SealPolicy)
        return result

    def turn(
        self,
        session: str,
        send_action: Mapping[str, Any] | Action,
        *,
        actor: str | None = None,
        max_delay: float = DEFAULT_MAX_DELAY,
    ) -> AsyncStreamingTurn:
        """Twin of :meth:`EventStore.turn <eventstore.EventStore.turn>`: ``async with
        store.turn(...) as turn``, then ``await turn.write(part)``, ``await turn.flush()``,
        ``await turn.stop()``. The turns of one async store share one flusher task."""
        return AsyncStreamingTurn(
            self._streams, session, send_action, actor=actor, max_delay=max_delay
        )

    async def recover(self, session: str, *, stale_after: float = 30.0) -> Recovery | None:
        """Twin of :meth:`EventStore.recover <eventstore.EventStore.recover>`."""
        return await run(turn_recovery.recover, self._engine, session, stale_after=stale_after)

    async def recovery_status(self, session: str, *, stale_after: float = 30.0) -> RecoveryStatus:
        """Twin of :meth:`EventStore.recovery_status <eventstore.EventStore.recovery_status>`."""
        return await run(turn_recovery.recovery_status_of, self._engine, session, stale_after=stale_after)

    async def close_session(self, session: str, *, reason: str | None = None) -> None:
        """Twin of :meth:`EventStore.close_session <eventstore.EventStore.close_session>`."""
        await run(turn_recovery.close_session, self._engine, session, reason=reason)

    async def branch(self, session: str, *, at: int | None = None, new_id: str | None = None) -> str:
        """Twin of :meth:`EventStore.branch <eventstore.EventStore.branch>`: fork a session
        copy-on-write; the branch's id."""
        return await run(self._engine.branch, session, at=at, new_id=new_id)

    async def rewind(
        self,
        session: str,
        *,
        to: int,
        expected_version: int | None = None,
        actor: str | None = None,
        reason: str | None = None,
    ) -> str | None:
        """Twin of :meth:`EventStore.rewind <eventstore.EventStore.rewind>`: the kept id,
        or ``None`` when ``to`` is the head."""
        return await run(
            rewind.rewind, self._engine, session, to=to, expected_version=expected_version, actor=actor, reason=reason
        )

    async def lines(self, session: str) -> list[SessionInfo]:
        """Twin of :meth:`EventStore.lines <eventstore.EventStore.lines>`: the lines rewound
        away from a session, oldest first."""
        return await run(rewind.lines, self._engine, session)

    async def seal(self, session: str | None = None) -> int:
        """Twin of :meth:`EventStore.seal <eventstore.EventStore.seal>`: seal every closed
        turn now (the background task may have sealed some already)."""
        return await run(self._engine.seal, session)

    async def compact(
        self,
        session: str,
        *,
        upto: int,
        archive: str | os.PathLike[str] | IO[str] | None = None,
        actor: str | None = None,
    ) -> CompactResult:
        """Twin of :meth:`EventStore.compact <eventstore.EventStore.compact>`."""
        return await run(compaction.compact, self._engine, session, upto=upto, archive=archive, actor=actor)

    async def compact_all(
        self, *, keep_last_turns: int, progress: Callable[[int, int, str], None] | None = None
    ) -> list[CompactResult]:
        """Twin of :meth:`EventStore.compact_all <eventstore.EventStore.compact_all>`."""
        return await run(
            compaction.compact_all, self._engine, keep_last_turns=keep_last_turns, progress=progress
        )

    async def import_(
        self, src: IO[str] | Iterable[str], *, progress: Callable[[int, int], None] | None = None
    ) -> list[ImportResult]:
        """Twin of :meth:`EventStore.import_ <eventstore.EventStore.import_>`."""
        return await run(importing.import_, self._engine, src, progress=progress)

    # -- reads --------------------------------------------------------------------------

    async def head(self, session: str) -> int:
        """Twin of :meth:`EventStore.head <eventstore.EventStore.head>`."""
        return await run(self._engine.head, session)

    async def load(self, session: str, *, version: int | None = None) -> SessionState:
        """Twin of :meth:`EventStore.load <eventstore.EventStore.load>`: the state at a
        version (``None``: the head)."""
        return SessionState.from_trusted(await run(self._engine.load, session, version))

    def follow(self, session: str, *, after: int = 0, idle_timeout: float | None = None) -> AsyncFollower:
        """``async for`` twin of :meth:`eventstore.EventStore.follow` (arguments checked
        and the session looked up when iteration starts). Waits await a ``LISTEN``
        connection (psycopg's ``AsyncConnection.notifies``) or SQLite's data version on
        this loop."""
        state = FollowState(time.time)
        plan = functools.partial(
            reads.follow_plan, self._engine, session, after=after, idle_timeout=idle_timeout, state=state
        )
        watcher = self._engine.async_watcher()
        return self._followers.follower(live(plan, watcher), state, watcher.wake)

    def feed(self, *, after: str | None = None, idle_timeout: float | None = 1.0) -> AsyncFollower:
        """``async for`` twin of :meth:`eventstore.EventStore.feed`."""
        state = FollowState(time.time)
        plan = functools.partial(reads.feed_plan, self._engine, after=after, idle_timeout=idle_timeout, state=state)
        watcher = self._engine.async_watcher()
        return self._followers.follower(live(plan, watcher), state, watcher.wake)

    def history(
        self,
        session: str,
        *,
        after: int | None = None,
        upto: int | None = None,
        limit: int | None = None,
        desc: bool = False,
    ) -> AsyncIterator[RecordedEvent]:
        """Twin of :meth:`EventStore.history <eventstore.EventStore.history>`, as an async
        iterator: ``async for event in store.history(s)``. The session is looked up (and an
        error raised) when iteration starts; events are read in chunks as you iterate."""
        return iterate(self._engine.history, session, after=after, upto=upto, limit=limit, desc=desc)

    async def sessions(self) -> list[SessionInfo]:
        """Twin of :meth:`EventStore.sessions <eventstore.EventStore.sessions>`."""
        return await run(self._engine.sessions)

    async def set_info(
        self,
        session: str,
        *,
        title: str | None = None,
        owner: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        actor: str | None = None,
    ) -> SessionInfo:
        """Twin of :meth:`EventStore.set_info <eventstore.EventStore.set_info>`."""
        return await run(
            catalogue.set_info, self._engine, session, title=title, owner=owner, metadata=metadata, actor=actor
        )

    async def info(self, session: str) -> SessionInfo:
        """Twin of :meth:`EventStore.info <eventstore.EventStore.info>`."""
        return await run(catalogue.info, self._engine, session)

    async def info_changes(self, session: str) -> list[InfoChange]:
        """Twin of :meth:`EventStore.info_changes <eventstore.EventStore.info_changes>`."""
        return await run(catalogue.info_changes, self._engine, session)

    async def list_sessions(
        self,
        *,
        owner: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        query: str | None = None,
        status: str | None = None,
        order: str = "recent",
        limit: int = 50,
        cursor: str | None = None,
        include_lines: bool = False,
    ) -> SessionPage:
        """Twin of :meth:`EventStore.list_sessions <eventstore.EventStore.list_sessions>`."""
        return await run(
            catalogue.list_sessions,
            self._engine,
            owner=owner,
            metadata=metadata,
            query=query,
            status=status,
            order=order,
            limit=limit,
            cursor=cursor,
            include_lines=include_lines,
        )

    async def diff(
        self, a: tuple[str, int | None], b: tuple[str, int | None], *, events: bool = False
    ) -> SessionDiff:
        """Twin of :meth:`EventStore.diff <eventstore.EventStore.diff>`."""
        return await run(timetravel.diff, self._engine, a, b, events=events)

    def replay(
        self, session: str, *, after: int | None = None, upto: int | None = None
    ) -> AsyncIterator[ReplayStep]:
        """Twin of :meth:`EventStore.replay <eventstore.EventStore.replay>`, as an async
        iterator (checked when iteration starts)."""
        return iterate(timetravel.replay, self._engine, session, after=after, upto=upto)

    async def turns(self, session: str, *, upto: int | None = None) -> list[Turn]:
        """Twin of :meth:`EventStore.turns <eventstore.EventStore.turns>`."""
        return await run(timetravel.turns, self._engine, session, upto=upto)

    async def export(
        self,
        session: str,
        out: str | os.PathLike[str] | IO[str],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Twin of :meth:`EventStore.export <eventstore.EventStore.export>`."""
        return await run(exporting.export, self._engine, session, out, progress=progress)

    async def verify(
        self,
        session: str | None = None,
        *,
        checkpoint: Checkpoint | None = None,
        public_key: bytes | None = None,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> VerifyReport:
        """Twin of :meth:`EventStore.verify <eventstore.EventStore.verify>`."""
        return await run(
            integrity.verify, self._engine, session, checkpoint=checkpoint, public_key=public_key, progress=progress
        )

    # -- audit --------------------------------------------------------------------------

    async def checkpoint(self, private_key: bytes, *, origin: str | None = None) -> Checkpoint:
        """Twin of :meth:`EventStore.checkpoint <eventstore.EventStore.checkpoint>`."""
        return await run(audit.checkpoint, self._engine, private_key, origin=origin)

    async def erase(self, session: str, *, reason: str, actor: str | None = None) -> list[str]:
        """Twin of :meth:`EventStore.erase <eventstore.EventStore.erase>`."""
        return await run(audit.erase, self._engine, session, reason=reason, actor=actor)

    async def erase_older_than(
        self,
        older_than: timedelta | str,
        *,
        reason: str,
        actor: str | None = None,
        dry_run: bool = False,
    ) -> list[str]:
        """Twin of :meth:`EventStore.erase_older_than <eventstore.EventStore.erase_older_than>`."""
        return await run(
            audit.erase_older_than, self._engine, older_than, reason=reason, actor=actor, dry_run=dry_run
        )

    async def report(
        self,
        session: str,
        version: int | None = None,
        *,
        against: tuple[str, int | None] | None = None,
        out: str | os.PathLike[str] | IO[str] | None = None,
        checkpoint: Checkpoint | None = None,
        public_key: bytes | None = None,
    ) -> str:
        """Twin of :meth:`EventStore.report <eventstore.EventStore.report>`."""
        return await run(
            report.report,
            self._engine,
            session,
            version,
            against=against,
            out=out,
            checkpoint=checkpoint,
            public_key=public_key,
        )
