"""Group commit of an asyncio store's appends.

An :class:`~eventstore.AsyncEventStore` serves many tasks of one event loop, and the
loop's one thread pays the client side of every transaction (statement, round trip,
wake-up). So its appends share transactions: while one is in flight, the appends that
arrive are planned and queued, and the next transaction writes them all
(:meth:`Engine.append_planned <eventstore.engine.engine.Engine.append_planned>`: one statement on
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

A transaction held up by a session row that another transaction keeps locked (a long
compaction elsewhere) holds up only its own appends: once it has been in flight for
:data:`STALL_AFTER`, the appends queued behind it go in a transaction of their own.
"""

from __future__ import annotations

import asyncio

from eventstore.core.records import AppendResult
from eventstore.engine.async_bridge import run
from eventstore.engine.engine import AppendRequest, Engine, PlannedAppend
from eventstore.engine.transaction_steps import now_micros
from eventstore.errors import EventStoreError, StorageError
from eventstore.storage.interface import EventIdRace

__all__ = ["AppendGroup", "MAX_GROUP", "STALL_AFTER"]

#: The most appends one group commit writes; the rest wait for the next.
MAX_GROUP = 256
#: Seconds a transaction may be in flight before the appends queued behind it stop
#: waiting for it and go in another one.
STALL_AFTER = 0.05

_Waiter = tuple[PlannedAppend, "asyncio.Future[AppendResult | None]"]


class _Transaction:
    """One transaction of the group in flight (a lone append or a group commit): whether it
    has been in flight longer than ``stall_after``, and the timer that will say so."""

    __slots__ = ("stalled", "timer")

    def __init__(self) -> None:
        self.stalled = False
        self.timer: asyncio.TimerHandle | None = None


class AppendGroup:
    """The group commit of one async store's appends (one event loop).

    ``append`` is what :meth:`AsyncEventStore.append <eventstore.AsyncEventStore.append>`
    awaits; ``close`` waits for the transactions in flight.
    """

    def __init__(
        self, engine: Engine, *, max_group: int = MAX_GROUP, stall_after: float = STALL_AFTER
    ) -> None:
        self._eng = engine
        self._max = max_group
        self._stall_after = stall_after
        # Transactions in flight, and those of them not yet stalled: appends queue only
        # behind a transaction that is not stalled.
        self._in_flight = 0
        self._in_flight_unstalled = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._queue: list[_Waiter] = []
        # Referenced here: the loop keeps only a weak reference to a task.
        self._tasks: set[asyncio.Task[None]] = set()

    async def append(self, req: AppendRequest) -> AppendResult:
        """Append a prepared batch; its result or error is exactly a lone append's."""
        eng = self._eng
        if not self._in_flight_unstalled:
            txn = self._begin()
            try:
                return await run(eng.append_request, req)
            finally:
                self._end(txn)
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

    def _begin(self) -> _Transaction:
        txn = _Transaction()
        self._in_flight += 1
        self._in_flight_unstalled += 1
        self._idle.clear()
        loop = asyncio.get_running_loop()
        txn.timer = loop.call_later(self._stall_after, self._stalled, txn)
        return txn

    def _stalled(self, txn: _Transaction) -> None:
        txn.stalled = True
        self._in_flight_unstalled -= 1
        self._kick()

    def _end(self, txn: _Transaction) -> None:
        if txn.timer is not None:
            txn.timer.cancel()
        if not txn.stalled:
            self._in_flight_unstalled -= 1
        self._in_flight -= 1
        self._kick()
        if not self._in_flight:
            self._idle.set()

    def _kick(self) -> None:
        """Commit what is queued, unless a transaction that is not stalled is in flight
        (then it starts the next group when it lands)."""
        while self._queue and not self._in_flight_unstalled:
            group = self._take()
            if group:
                task = asyncio.get_running_loop().create_task(self._commit(group, self._begin()))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

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

    async def _commit(self, group: list[_Waiter], txn: _Transaction) -> None:
        eng = self._eng
        try:
            try:
                written = await run(eng.append_planned, [planned for planned, _ in group])
            except EventStoreError as exc:
                # An event id race included: nothing was written; alone, each finds out.
                race = isinstance(exc, EventIdRace)
                if isinstance(exc, StorageError) and exc.retryable and not race:
                    _fail(group, exc)  # maybe committed: as a lone append would, say so
                    return
                written = [False] * len(group)
            for (planned, done), ok in zip(group, written):
                result = eng.appended(planned) if ok else None
                if not done.done():
                    done.set_result(result)
        except BaseException as exc:
            # Cancelled (the loop is closing) or a bug: no waiter is left hanging.
            _fail(group, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._end(txn)


def _fail(group: list[_Waiter], exc: BaseException) -> None:
    for _, done in group:
        if done.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            done.cancel()
        else:
            done.set_exception(exc)
