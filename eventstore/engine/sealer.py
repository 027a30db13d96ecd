"""Sealing closed turns into segments: now (``store.seal()``) or in the background.

A turn is closed once a later turn of its session has begun (its ``send`` is recorded):
nothing can be appended to it any more, and the session's newest turn — where an append
with an event id that is retried must still meet the unique index on ``events`` — stays
rows. Each closed turn's rows become one segment in the transaction that deletes them
(consecutive turns of fewer than :data:`MIN_EVENTS` events are joined into one)
(:meth:`~eventstore.storage.interface.Storage.seal_turns`), several turns per transaction,
each session's row locked while its turns are sealed so that no append interleaves.
A crash at any point leaves either the rows or the segment, never both, never neither.

The background worker is woken by the planner when an append of this process starts a
new turn: a daemon thread of a sync store, a task of the event loop of an async one (its
connections belong to that loop). Both take their decisions from one :class:`_Backlog`
(which sessions to seal next, when to try again those skipped) and do the same work
(:meth:`Sealer.seal_sessions`); only how they wait differs. The worker never holds up an
append: on PostgreSQL it skips a session whose row an append holds (``SKIP LOCKED``) and
tries again :data:`RETRY_AFTER` later; and it waits for the feed's barrier to pass a turn
before sealing it. A failure is logged and the session tried again later: sealing is never
an append's error.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from typing import Any

from eventstore.core.rows import SealableTurn
from eventstore.engine.async_bridge import run
from eventstore.errors import EventStoreError

__all__ = ["Sealer", "LoopWorker", "TURNS_PER_TRANSACTION", "RETRY_AFTER"]

_log = logging.getLogger(__name__)

#: Segments sealed per transaction (a turn of the benchmark workload is 86 events).
TURNS_PER_TRANSACTION = 16
#: Consecutive closed turns of fewer events are joined into one segment of at least this
#: many (a segment row costs ~150 bytes: a turn of one event is not worth one); fewer wait
#: for the next closed turn.
MIN_EVENTS = 32
#: Turns listed per look for them.
_LISTED = 4096
#: Seconds before the worker tries again sessions it could not seal (a held row lock,
#: the feed's barrier not past the turn yet).
RETRY_AFTER = 0.5


def _joined(listed: list[SealableTurn]) -> list[SealableTurn]:
    """The listed turns as segments: each turn of at least :data:`MIN_EVENTS` alone,
    consecutive smaller ones joined until they reach it (a short run left at a session's
    end waits for more closed turns)."""
    out: list[SealableTurn] = []
    run: SealableTurn | None = None
    for t in listed:
        if run is not None and (run.session_pk != t.session_pk or run.last + 1 != t.first):
            run = None  # not joinable: a shorter run is left for later
        if run is None:
            run = t
        else:
            run = SealableTurn(t.session_pk, run.turn, run.first, t.last, t.last_turn)
        if run.last - run.first + 1 >= MIN_EVENTS:
            out.append(run)
            run = None
    return out


class _Backlog:
    """What a background worker has to do, and when: the decisions both workers share.

    Not locked: the thread worker holds its condition around every call, the loop worker
    calls it from the loop's one thread."""

    def __init__(self) -> None:
        self.pending: set[int] = set()  # sessions with a closed turn to seal now
        self.retry: set[int] = set()  # sessions skipped: tried again after RETRY_AFTER
        self.closed = False
        self.busy = 0

    def idle(self) -> bool:
        """Nothing queued, nothing in hand."""
        return not self.pending and not self.busy

    def ready(self) -> bool:
        """Whether the worker should stop waiting (work, or closing)."""
        return bool(self.pending) or self.closed

    def timeout(self) -> float | None:
        """How long to wait for a wake-up before trying the skipped sessions again."""
        return RETRY_AFTER if self.retry else None

    def timed_out(self) -> None:
        """No wake-up came in time: the skipped sessions are due."""
        self.pending |= self.retry
        self.retry = set()

    def take(self) -> set[int]:
        """The sessions to seal now (the worker is busy until :meth:`done`)."""
        pks, self.pending = self.pending, set()
        self.busy += 1
        return pks

    def done(self, skipped: set[int]) -> None:
        """The sessions taken are sealed, but for ``skipped`` (tried again later)."""
        self.retry |= skipped
        self.busy -= 1


class Sealer:
    """Seals an engine's closed turns; owns the background worker (started on first wake):
    a thread, or with ``on_loop`` a task of the running event loop."""

    def __init__(self, engine: Any, *, background: bool, on_loop: bool = False) -> None:
        # `engine`: the Engine that owns this sealer (not imported: it imports this module).
        self._owner = engine
        #: Whether a worker seals in the background (else only :meth:`seal` does).
        self.background = background
        self._backlog = _Backlog()
        self._worker: _ThreadWorker | LoopWorker = LoopWorker(self) if on_loop else _ThreadWorker(self)
        self._sealed_any = False

    @property
    def may_have_sealed(self) -> bool:
        """Whether this process seals, or has sealed (appends with event ids then check
        the segments for them: see ``Engine.plan_optimistic``)."""
        return self.background or self._sealed_any

    # -- sealing now --------------------------------------------------------------------

    def seal(self, session_pk: int | None = None, *, wait: bool = True) -> int:
        """Seal every closed turn (of one session, or of all) still stored as rows; the
        number of turns sealed. ``wait=False``: skip sessions another transaction holds."""
        return self._seal(session_pk, wait)[0]

    def _seal(self, session_pk: int | None, wait: bool) -> tuple[int, bool]:
        """:meth:`seal`, and whether it left a listed turn unsealed (a held lock, the
        feed's barrier, a chain that does not verify, or closing)."""
        st = self._owner.storage
        failed: set[tuple[int, int]] = set()
        total = 0
        while True:
            with st.read() as tx:
                listed = st.sealable_turns(tx, session_pk, _LISTED)
            todo = [t for t in _joined(listed) if (t.session_pk, t.turn) not in failed]
            if not todo:
                return total, bool(failed)
            for i in range(0, len(todo), TURNS_PER_TRANSACTION):
                if self._backlog.closed:
                    return total, True
                batch = todo[i : i + TURNS_PER_TRANSACTION]
                done = self._seal_batch(batch, wait)
                total += sum(t.turns for t in done)
                self._sealed_any = self._sealed_any or bool(done)
                failed.update((t.session_pk, t.turn) for t in batch if t not in done)
            if len(listed) < _LISTED:
                return total, bool(failed)  # the list was complete

    def _seal_batch(self, batch: Iterable[SealableTurn], wait: bool) -> list[SealableTurn]:
        eng = self._owner
        st = eng.storage
        done: list[SealableTurn] = []
        by_session: dict[int, list[SealableTurn]] = {}
        for t in batch:
            by_session.setdefault(t.session_pk, []).append(t)
        with st.write() as tx:
            for pk, turns in by_session.items():
                row = st.session(tx, pk=pk, lock=True, wait=wait)
                if row is None:
                    continue
                hashed_as = eng.event_names(tx, [row])[row.pk]
                done += st.seal_turns(tx, row, turns, hashed_as)
        return done

    # -- the background worker ----------------------------------------------------------

    def seal_sessions(self, pks: Iterable[int]) -> set[int]:
        """One round of the background worker: seal these sessions' closed turns without
        waiting for a lock; the sessions left with turns to seal (skipped for a held lock,
        the feed's barrier, or a failure, which is logged), to try again later."""
        skipped: set[int] = set()
        for pk in sorted(pks):
            if self._backlog.closed:
                break
            try:
                if self._seal(pk, wait=False)[1]:
                    skipped.add(pk)
            except EventStoreError as exc:
                _log.warning("sealing session row %d failed: %s", pk, exc)
                skipped.add(pk)
        return skipped

    def wake(self, session_pk: int) -> None:
        """A turn of this session has closed: seal it soon (never blocks, never raises)."""
        self._worker.wake(session_pk)

    def idle(self) -> bool:
        """Whether the worker has nothing queued and nothing in hand."""
        return self._worker.idle()

    def close(self) -> None:
        """Stop the worker (what it has not sealed yet is sealed by a later store); a loop
        worker is only cancelled here, when :meth:`aclose` was not awaited first."""
        self._worker.stop()

    async def aclose(self) -> None:
        """Stop the worker from the event loop it runs on and wait until it has stopped
        (the async store's ``close``, before its connections are released)."""
        if isinstance(self._worker, LoopWorker):
            await self._worker.close()
        else:
            self._worker.stop()


class _ThreadWorker:
    """The sync store's worker: a daemon thread waiting on a condition."""

    def __init__(self, sealer: Sealer) -> None:
        self._sealer = sealer
        self._backlog = sealer._backlog
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def wake(self, session_pk: int) -> None:
        with self._cond:
            if self._backlog.closed:
                return
            self._backlog.pending.add(session_pk)
            if self._thread is None:
                name = f"eventstore-seal {self._sealer._owner.storage.safe_url}"
                self._thread = threading.Thread(target=self._run, name=name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def idle(self) -> bool:
        with self._cond:
            return self._backlog.idle()

    def _run(self) -> None:
        backlog = self._backlog
        while True:
            with self._cond:
                while not backlog.ready():
                    if not self._cond.wait(backlog.timeout()):
                        backlog.timed_out()
                if backlog.closed:
                    return
                pks = backlog.take()
            skipped: set[int] = set()
            try:
                skipped = self._sealer.seal_sessions(pks)
            finally:
                with self._cond:
                    backlog.done(skipped)

    def stop(self) -> None:
        with self._cond:
            self._backlog.closed = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join()


class LoopWorker:
    """The async store's worker: a task of the event loop the store runs on, started by
    the first wake-up (which comes from an append, on that loop), each round run in a
    greenlet (:func:`~eventstore.engine.async_bridge.run`) so that its I/O awaits."""

    def __init__(self, sealer: Sealer) -> None:
        self._sealer = sealer
        self._backlog = sealer._backlog
        self._event: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def wake(self, session_pk: int) -> None:
        if self._backlog.closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on the store's loop: the turn waits for the next wake-up
        self._backlog.pending.add(session_pk)
        if self._task is None:
            self._event = asyncio.Event()
            self._task = loop.create_task(self._run(), name="eventstore-seal")
        assert self._event is not None
        self._event.set()

    def idle(self) -> bool:
        return self._backlog.idle()

    async def _run(self) -> None:
        backlog = self._backlog
        while not backlog.closed:
            if not backlog.pending:
                await self._sleep(backlog.timeout())
                continue
            pks = backlog.take()
            skipped: set[int] = set()
            try:
                skipped = await run(self._sealer.seal_sessions, pks)
            except Exception:  # noqa: BLE001 - a bug must not end sealing for good
                _log.exception("sealing sessions %s failed", sorted(pks))
                skipped = pks
            finally:
                backlog.done(skipped)

    async def _sleep(self, timeout: float | None) -> None:
        """Until a wake-up, or ``timeout`` seconds (then the skipped sessions are due)."""
        event = self._event
        assert event is not None
        event.clear()  # no await since the loop saw `pending` empty: no wake-up is lost
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            self._backlog.timed_out()

    def stop(self) -> None:
        """Stop without waiting (the loop may be gone): cancel the task if still there."""
        self._backlog.closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()

    async def close(self) -> None:
        """Stop the task and wait for it: an idle one is cancelled; one in a round ends it
        at its next transaction's end (a cancelled transaction would leave its connection
        to the pool's care), so no task and no connection of it is left."""
        self._backlog.closed = True
        task, self._task = self._task, None
        if task is None:
            return
        if self._backlog.busy:
            assert self._event is not None
            self._event.set()
        else:
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
