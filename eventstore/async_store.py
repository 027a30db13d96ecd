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
second implementation: most methods run the sync facade's own method (its signature and
docstring too) through :func:`eventstore.engine.async_bridge.run`, over a storage opened
with asyncio drivers (psycopg's ``AsyncConnection`` on PostgreSQL, aiosqlite on SQLite). See
:mod:`eventstore.engine.async_bridge` for how the I/O awaits on the event loop.

One ``AsyncEventStore`` serves any number of tasks of one event loop; its connection pool
belongs to that loop.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

from eventstore.core.feed_rules import AsyncFollower, FollowState, Live
from eventstore.core.records import AppendResult
from eventstore.engine import reads
from eventstore.engine.async_bridge import AsyncOpenFollowers, iterate, live, run
from eventstore.engine.async_turns import AsyncStreamingTurn, AsyncTurnWriter
from eventstore.engine.facade import StoreBase
from eventstore.engine.group_commit import AppendGroup
from eventstore.store import EventStore

__all__ = ["AsyncEventStore"]

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")

#: What an awaited twin's docstring says before the sync method's own.
AWAITED = "Awaited; otherwise the same arguments, result and errors."


def _twin(
    sync: Callable[Concatenate[Any, P], Any], how: str, *, returns: str | None = None
) -> Callable[[Callable[..., R]], Callable[Concatenate[AsyncEventStore, P], R]]:
    """Present the decorated method as the async twin of the sync facade's ``sync``.

    The twin takes ``sync``'s name, its docstring (written once, on :class:`EventStore`)
    after a line on what the async form changes (``how``), and, unless it declares its own
    parameters, ``sync``'s signature, with ``returns`` as the return annotation where the
    async form returns something else. ``help()`` and the docs thus show the real
    arguments of a twin written ``(self, *args, **kwargs)``.
    """

    def present(method: Callable[..., R]) -> Callable[Concatenate[AsyncEventStore, P], R]:
        name = sync.__name__
        sig = inspect.signature(sync)
        method.__name__ = name
        method.__qualname__ = f"AsyncEventStore.{name}"
        lead = f"Twin of :meth:`EventStore.{name} <eventstore.EventStore.{name}>`. {how}"
        lead = textwrap.fill(lead, 88, break_long_words=False, break_on_hyphens=False)
        method.__doc__ = f"{lead}\n\n{inspect.cleandoc(sync.__doc__ or '')}"
        params = inspect.signature(method).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            sig = sig.replace(return_annotation=returns or sig.return_annotation)
            method.__signature__ = sig  # type: ignore[attr-defined]
        return method

    return present


def _with_defaults(
    sync: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` bound to the parameters of the sync method ``sync`` (``self``
    aside), its defaults filled in: what the sync method hands on, for a twin that calls
    the engine itself. A call that does not fit raises ``TypeError`` as the sync one does."""
    call = inspect.signature(sync).bind(None, *args, **kwargs)
    call.apply_defaults()
    return call.args[1:], call.kwargs


def _awaited(
    sync: Callable[Concatenate[Any, P], T], how: str = AWAITED
) -> Callable[Concatenate[AsyncEventStore, P], Coroutine[Any, Any, T]]:
    """The async twin of a sync facade method: the same method body, run by
    :func:`~eventstore.engine.async_bridge.run` so its database I/O awaits on the loop."""

    async def twin(self: AsyncEventStore, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await run(sync, self, *args, **kwargs)

    return _twin(sync, how)(twin)


def _iterated(
    sync: Callable[Concatenate[Any, P], Iterator[T]], how: str
) -> Callable[Concatenate[AsyncEventStore, P], AsyncIterator[T]]:
    """The async-iterator twin of a sync facade method returning an iterator (see
    :func:`~eventstore.engine.async_bridge.iterate`)."""

    def twin(self: AsyncEventStore, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        return iterate(sync, self, *args, **kwargs)

    return _twin(sync, how, returns=f"Async{inspect.signature(sync).return_annotation}")(twin)


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

    On PostgreSQL the one-statement appends and loads run in autocommit on connections of
    the same pool as the transactions (at most ``pool_size + max_overflow`` in all).
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

    @_twin(EventStore.close, AWAITED)
    async def close(self) -> None:
        await self._followers.close()
        await self._streams.close()
        await self._appends.close()
        await self._engine.sealer.aclose()
        await run(self._engine.close)

    async def __aenter__(self) -> AsyncEventStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    migrate = _awaited(EventStore.migrate)
    check_schema = _awaited(EventStore.check_schema)

    # -- writes -------------------------------------------------------------------------

    @_twin(
        EventStore.append,
        "Awaited. Appends of several tasks share transactions (group commit, see "
        ":mod:`eventstore.engine.group_commit`); each gets the result or error it would get alone.",
    )
    async def append(self, *args: Any, **kwargs: Any) -> AppendResult:
        result = await self._appends.append(self._engine.prepare_append(*args, **kwargs))
        if self._engine.sealer.over_cap():
            await run(self._engine.sealer.assist)  # the backlog's bound (SealPolicy)
        return result

    @_twin(
        EventStore.turn,
        "``async with store.turn(...) as turn``, then ``await turn.write(part)``, "
        "``await turn.flush()``, ``await turn.stop()``. The turns of one async store share "
        "one flusher task.",
        returns="AsyncStreamingTurn",
    )
    def turn(self, *args: Any, **kwargs: Any) -> AsyncStreamingTurn:
        args, kwargs = _with_defaults(EventStore.turn, args, kwargs)
        return AsyncStreamingTurn(self._streams, *args, **kwargs)

    recover = _awaited(EventStore.recover)
    recovery_status = _awaited(EventStore.recovery_status)
    close_session = _awaited(EventStore.close_session)
    branch = _awaited(EventStore.branch)
    rewind = _awaited(EventStore.rewind)
    lines = _awaited(EventStore.lines)
    seal = _awaited(EventStore.seal, f"{AWAITED} The background task may have sealed some already.")
    compact = _awaited(EventStore.compact)
    compact_all = _awaited(EventStore.compact_all)
    import_ = _awaited(EventStore.import_)

    # -- reads --------------------------------------------------------------------------

    head = _awaited(EventStore.head)
    load = _awaited(EventStore.load)

    @_twin(
        EventStore.follow,
        "An ``async for`` follower: the arguments are checked and the session looked up "
        "when iteration starts. Waits await a ``LISTEN`` connection (psycopg's "
        "``AsyncConnection.notifies``) or SQLite's data version on this loop.",
    )
    def follow(self, session: str, *, after: int = 0, idle_timeout: float | None = None) -> AsyncFollower:
        state = FollowState(time.time)
        plan = functools.partial(
            reads.follow_plan, self._engine, session, after=after, idle_timeout=idle_timeout, state=state
        )
        return self._live(plan, state)

    @_twin(EventStore.feed, "An ``async for`` follower.")
    def feed(self, *, after: str | None = None, idle_timeout: float | None = 1.0) -> AsyncFollower:
        state = FollowState(time.time)
        plan = functools.partial(reads.feed_plan, self._engine, after=after, idle_timeout=idle_timeout, state=state)
        return self._live(plan, state)

    def _live(self, plan: Callable[[], Live], state: FollowState) -> AsyncFollower:
        watcher = self._engine.async_watcher()
        return self._followers.follower(live(plan, watcher), state, watcher.wake)

    history = _iterated(
        EventStore.history,
        "An async iterator: ``async for event in store.history(s)``. Unlike the sync "
        "method's, the session is looked up (and an error raised) when iteration starts.",
    )
    sessions = _awaited(EventStore.sessions)
    set_info = _awaited(EventStore.set_info)
    info = _awaited(EventStore.info)
    info_changes = _awaited(EventStore.info_changes)
    list_sessions = _awaited(EventStore.list_sessions)
    diff = _awaited(EventStore.diff)
    replay = _iterated(EventStore.replay, "An async iterator, checked when iteration starts.")
    turns = _awaited(EventStore.turns)
    export = _awaited(EventStore.export)
    verify = _awaited(EventStore.verify)

    # -- audit --------------------------------------------------------------------------

    checkpoint = _awaited(EventStore.checkpoint)
    erase = _awaited(EventStore.erase)
    erase_older_than = _awaited(EventStore.erase_older_than)
    report = _awaited(EventStore.report)
