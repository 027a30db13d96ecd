"""The bridge that lets the one engine serve asyncio callers: greenlets, as in SQLAlchemy.

:class:`~eventstore.engine.engine.Engine` and the feature modules are written once, as plain
functions over a :class:`~eventstore.storage.Storage`. The asyncio twin does not copy
them: it gives the engine a storage whose SQLAlchemy engine is the sync face of an
asyncio engine (psycopg's ``AsyncConnection`` on PostgreSQL, aiosqlite's per-connection
thread on SQLite) and runs each engine call with :func:`run`, inside a greenlet. Every
database round trip then suspends that greenlet and awaits the driver on the event loop
(SQLAlchemy's ``await_``); nothing blocks the loop but the Python work between two round
trips (validation, encoding, hashing, one fold). No thread pool, no nested event loop.

Adding the async twin of a new facade method is one line in the async facade, which runs
the sync facade's method with :func:`run`::

    feed = _awaited(EventStore.feed)

and :func:`iterate` turns a method returning an iterator into an async iterator.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy.util import greenlet_spawn

from eventstore.core.feed_rules import AsyncFollower, FollowState, Live, wait_arg
from eventstore.core.records import RecordedEvent
from eventstore.engine.reads import CLOSE_TIMEOUT
from eventstore.errors import StorageError
from eventstore.storage.interface import AsyncChangeWatcher

__all__ = ["run", "run_to_end", "iterate", "live", "AsyncOpenFollowers", "STEPS_PER_SWITCH"]

T = TypeVar("T")

#: Items an async iterator pulls from the engine's iterator per greenlet switch (one
#: storage chunk of a history; a replay folds this many single events at most).
STEPS_PER_SWITCH = 1000


async def run(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` in a greenlet whose database I/O awaits on this loop.

    ``fn`` is engine code over an asyncio-backed storage. Its exceptions propagate as they
    are (the same :class:`~eventstore.errors.EventStoreError` the sync store raises).
    """
    return await greenlet_spawn(fn, *args, **kwargs)


async def run_to_end(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """:func:`run` for a read whose caller may be cancelled at any moment (a stream's client
    going away): the caller's cancellation returns at once, and the read runs to its end in
    a task of its own. Cancelled inside the greenlet instead, the read would be cut in the
    middle of giving its connection back (the pool's rollback awaits too, and a cancel
    scope cancels every await in it): the pool logs the failed reset and discards the
    connection. Only for reads: a cancelled write should not go on."""
    task = asyncio.ensure_future(run(fn, *args, **kwargs))
    task.add_done_callback(_retrieved)
    return await asyncio.shield(task)


def _retrieved(task: asyncio.Future[Any]) -> None:
    # A read left to finish after its caller was cancelled: its outcome goes nowhere (and
    # asyncio would otherwise report an exception "never retrieved").
    if not task.cancelled():
        task.exception()


def _take(it: Iterator[T], n: int) -> list[T]:
    out: list[T] = []
    for item in it:
        out.append(item)
        if len(out) == n:
            break
    return out


async def iterate(
    fn: Callable[..., Iterator[T]], /, *args: Any, **kwargs: Any
) -> AsyncIterator[T]:
    """An async iterator over what ``fn(*args, **kwargs)`` yields.

    ``fn`` runs (its argument checks and first reads included) when iteration starts; the
    items are then pulled in slices of :data:`STEPS_PER_SWITCH`, each slice in a greenlet,
    so the storage reads they need await on the loop as well.
    """
    it = await run_to_end(fn, *args, **kwargs)
    while True:
        items = await run_to_end(_take, it, STEPS_PER_SWITCH)
        for item in items:
            yield item
        if len(items) < STEPS_PER_SWITCH:
            return


async def live(
    make_plan: Callable[[], Live], watcher: AsyncChangeWatcher
) -> AsyncGenerator[RecordedEvent, None]:
    """The async driver of a follower's plan (:func:`eventstore.engine.reads.follow_plan` /
    ``feed_plan``): the same decisions as the sync one (:func:`eventstore.engine.reads.drive`), with the
    reads run in greenlets and the waits awaited on the storage's async watcher.

    The plan is made (arguments checked, the session looked up) when iteration starts.
    """
    plan = await run_to_end(make_plan)
    while True:
        chunk = await run_to_end(_take, plan.past, STEPS_PER_SWITCH)
        for ev in chunk:
            if not plan.handing_out(ev):
                return
            yield ev
        if len(chunk) < STEPS_PER_SWITCH:
            break
    plan.past_done(time.monotonic())
    while not plan.state.closed:
        seen = await watcher.generation()
        try:
            batch, pending, full = await run_to_end(plan.read)
        except StorageError as exc:
            await asyncio.sleep(plan.retry_delay(exc, time.monotonic()))
            continue
        for ev in plan.hand_out(batch):
            yield ev
        wait = plan.after_read(bool(batch), pending, full, time.monotonic())
        if wait is None:
            return
        if wait:
            await watcher.wait(seen, wait_arg(wait))


class AsyncOpenFollowers:
    """The async twin of :class:`eventstore.engine.reads.OpenFollowers`: an async store's
    followers not closed yet, all on the store's event loop, ended by :meth:`close`."""

    def __init__(self) -> None:
        self._open: weakref.WeakSet[AsyncFollower] = weakref.WeakSet()
        self._stepping = 0
        self._idle: asyncio.Event | None = None
        self._closed = False

    def follower(
        self, events: AsyncGenerator[RecordedEvent, None], state: FollowState, wake: Callable[[], None]
    ) -> AsyncFollower:
        """A follower handing out ``events``, ended by :meth:`close`."""
        if self._closed:
            raise StorageError("the store is closed", retryable=False)
        follower = AsyncFollower(self._steps(events), state, wake)
        self._open.add(follower)
        return follower

    async def _steps(self, events: AsyncGenerator[RecordedEvent, None]) -> AsyncIterator[RecordedEvent]:
        try:
            while not self._closed:
                self._stepping += 1
                try:
                    ev = await anext(events, None)
                finally:
                    self._stepping -= 1
                    if self._stepping == 0 and self._idle is not None:
                        self._idle.set()
                if ev is None:
                    return
                yield ev
        finally:
            await events.aclose()

    async def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Close every follower, then wait (at most ``timeout`` seconds) for the steps
        still running in other tasks to end; later followers are refused."""
        self._closed = True
        for f in list(self._open):
            f.close()
        if self._stepping:
            self._idle = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)
