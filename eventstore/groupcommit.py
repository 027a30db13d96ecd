"""Group commit of an asyncio store's appends.

An :class:`~eventstore.AsyncEventStore` serves many tasks of one event loop, and the
loop's one thread pays the client side of every transaction (statement, round trip,
wake-up). So its appends share transactions: while one is in flight, the appends that
arrive are planned and queued, and the next transaction writes them all
(:meth:`Engine.append_planned <eventstore.engine.Engine.append_planned>`: one statement on
PostgreSQL). An append that finds nothing in flight goes at once, alone, by the path the
sync store takes — no added delay when the store is idle.

The group is only a fast path; every result and error stays exactly what a lone append
gives:

- an append is grouped only when it can take the optimistic path (this process knows
  the session's head, and the caller expects that head or none); its rows, hashes and
  snapshots are planned by the engine, as for the optimistic path;
- each grouped append is written only if its session's head is still the one it was
  planned on and the session is open, at most one per session per transaction; one
  whose check fails — the head moved, the session was closed — is done again by the
  lone path, which then gives its result or error;
- when the transaction fails on an event id already recorded, or with any error that
  is not worth retrying, nothing was written and every append of the group is done
  again by the lone path (so each gets its own result or error); a retryable
  :class:`~eventstore.errors.StorageError` (a lost connection may have committed) is
  raised to every append of the group, as a lone append would raise it;
- the planner's caches are updated only after the commit.
"""

from __future__ import annotations

import asyncio

from .aio import run
from .engine import AppendRequest, Engine, PlannedAppend, now_micros
from .errors import EventStoreError, StorageError
from .records import AppendResult
from .storage.base import EventIdRace

__all__ = ["AppendGroup", "MAX_GROUP"]

#: The most appends one group commit writes; the rest wait for the next.
MAX_GROUP = 256

_Waiter = tuple[PlannedAppend, "asyncio.Future[AppendResult | None]"]


class AppendGroup:
    """The group commit of one async store's appends (one event loop).

    ``append`` is what :meth:`AsyncEventStore.append <eventstore.AsyncEventStore.append>`
    awaits; ``close`` waits for the group in flight.
    """

    def __init__(self, engine: Engine, *, max_group: int = MAX_GROUP) -> None:
        self._eng = engine
        self._max = max_group
        # Whether a transaction of this group is in flight (a lone append or a group).
        self._busy = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._queue: list[_Waiter] = []
        self._task: asyncio.Task[None] | None = None

    async def append(self, req: AppendRequest) -> AppendResult:
        """Append a prepared batch; its result or error is exactly a lone append's."""
        eng = self._eng
        if not self._busy:
            self._busy = True
            self._idle.clear()
            try:
                return await run(eng.append_request, req)
            finally:
                self._next()
        planned = eng.plan_optimistic(req, now_micros())
        if planned is not None:
            done: asyncio.Future[AppendResult | None] = asyncio.get_running_loop().create_future()
            self._queue.append((planned, done))
            result = await done
            if result is not None:
                return result
        # No head to build on, or its check failed in the group: the lone path decides.
        return await run(eng.append_request, req)

    async def close(self) -> None:
        """Wait until the appends in flight and queued are committed (or have failed)."""
        await self._idle.wait()

    def _next(self) -> None:
        """After a transaction: commit what queued meanwhile, or become idle."""
        if self._queue:
            # Referenced here: the loop keeps only a weak reference to a task.
            self._task = asyncio.get_running_loop().create_task(self._commit_queued())
        else:
            self._busy = False
            self._idle.set()

    async def _commit_queued(self) -> None:
        try:
            while self._queue:
                group = self._take()
                if group:
                    await self._commit(group)
        except BaseException as exc:
            # Cancelled (the loop is closing) or a bug: no waiter is left hanging.
            queued, self._queue = self._queue, []
            _fail(queued, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._busy = False
            self._task = None
            self._idle.set()

    def _take(self) -> list[_Waiter]:
        """The next group: at most ``max_group`` appends, one per session, in arrival
        order; an append whose caller gave up (cancelled) is dropped unwritten."""
        group: list[_Waiter] = []
        rest: list[_Waiter] = []
        sessions: set[int] = set()
        for item in self._queue:
            planned, done = item
            if done.done():
                continue
            if len(group) < self._max and planned.row.pk not in sessions:
                sessions.add(planned.row.pk)
                group.append(item)
            else:
                rest.append(item)
        self._queue = rest
        # Rows locked in one order by every group: two groups never wait on each other.
        group.sort(key=lambda item: item[0].row.pk)
        return group

    async def _commit(self, group: list[_Waiter]) -> None:
        eng = self._eng
        try:
            written = await run(eng.append_planned, [planned for planned, _ in group])
        except EventIdRace:
            written = [False] * len(group)  # nothing written; alone, each finds out
        except StorageError as exc:
            if exc.retryable:
                _fail(group, exc)
                return
            written = [False] * len(group)  # nothing written
        except EventStoreError:
            written = [False] * len(group)
        except BaseException as exc:
            _fail(group, exc)
            raise
        for (planned, done), ok in zip(group, written):
            result = eng.appended(planned) if ok else None
            if not done.done():
                done.set_result(result)


def _fail(group: list[_Waiter], exc: BaseException) -> None:
    for _, done in group:
        if done.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            done.cancel()
        else:
            done.set_exception(exc)
