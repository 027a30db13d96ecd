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
(which sessions to seal next, when, when to try again those skipped) and do the same work
(:meth:`Sealer.seal_sessions`); only how they wait differs. When is a :class:`SealPolicy`:
the worker yields to the store's appends (it seals once they have paused) but bounds the
backlog of closed turns waiting (by count and by age), and at the bound an append that
closes a turn seals the longest-waiting session itself (:meth:`Sealer.assist`). The worker
never holds up an append: on PostgreSQL it skips a session whose row an append holds
(``SKIP LOCKED``) and tries again :data:`RETRY_AFTER` later; an append of its store that
begins while it seals waits one turn at most (a yielding round asks before each turn,
and commits once the appends are back); and it waits for the feed's barrier to pass a
turn before sealing it. A failure is logged and the session tried again
later: sealing is never an append's error.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from eventstore.core.rows import SealableTurn
from eventstore.engine.async_bridge import run
from eventstore.errors import EventStoreError, InvalidEvent

__all__ = ["SealPolicy", "Sealer", "LoopWorker", "TURNS_PER_TRANSACTION", "RETRY_AFTER"]

_log = logging.getLogger(__name__)

#: Segments sealed per transaction (a turn of the benchmark workload is 86 events).
TURNS_PER_TRANSACTION = 16
#: Consecutive closed turns of fewer events are joined into one segment of at least this
#: many (a segment row costs ~150 bytes: a turn of one event is not worth one); fewer wait
#: for the next closed turn.
MIN_EVENTS = 32
#: Turns listed per look for them.
_LISTED = 4096
#: Inside sealed turns, one snapshot in this many is kept (the others go, with the blobs
#: only they named): an old-version checkout folds up to this many times
#: ``snapshot_every`` events, for a sealed session's snapshot bytes roughly halved.
SEALED_SNAPSHOT_SPACING = 2
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


@dataclass(frozen=True)
class SealPolicy:
    """When a writing store's background sealer works: ``EventStore(url,
    seal=SealPolicy(...))`` (``seal=True`` is ``SealPolicy()``).

    Sealing a turn costs a fraction of appending it, paid on the same CPUs and database.
    Like a cost-based vacuum delay, the worker yields to the store's appends: it seals
    once none has begun or committed for ``quiet`` seconds, and once one begins it
    commits at the next turn and waits for the next pause (that append waits for its
    session's row one turn at most), so a writer going flat out keeps its throughput and
    the work is done in its pauses. The backlog of closed turns waiting is
    bounded all the same: once half of ``max_backlog`` wait, or one has waited ``max_age``
    seconds, the worker seals without waiting for a pause; and at ``max_backlog`` each
    append that closes a turn (``append``, or a streaming turn's ``send``) also seals the
    session waiting longest before it returns (its own events are committed first: a
    failure there is logged, never raised). So however fast the writers go, the backlog
    stays within ``max_backlog`` plus one turn per writer, but for turns that cannot be
    sealed yet (the feed's barrier not past them, or rows that do not verify, which
    ``verify`` reports), tried again :data:`RETRY_AFTER` later.

    Attributes:
        quiet: seconds without an append of this store before the worker seals (0: it
            never waits for a pause).
        max_age: seconds a closed turn may wait before the worker seals it regardless.
        max_backlog: closed turns waiting at which appends seal too (the worker stops
            yielding at half of it).
    """

    quiet: float = 0.2
    max_age: float = 10.0
    max_backlog: int = 1000

    def __post_init__(self) -> None:
        for name in ("quiet", "max_age"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not 0 <= value < float("inf"):
                raise InvalidEvent(f"{name} must be a finite number of seconds >= 0, got {value!r}", field=name)
        if type(self.max_backlog) is not int or self.max_backlog < 2:
            raise InvalidEvent(f"max_backlog must be an integer >= 2, got {self.max_backlog!r}", field="max_backlog")


class _Backlog:
    """What a background worker has to do, and when: the decisions both workers (and the
    appends that assist them) share, under one reentrant lock (the thread worker's
    condition is built on it)."""

    def __init__(self, policy: SealPolicy) -> None:
        self.policy = policy
        self.lock = threading.RLock()
        self.pending: set[int] = set()  # sessions with a closed turn to seal
        self.retry: set[int] = set()  # sessions skipped: tried again at `retry_at`
        self.retry_at = 0.0
        self.closed = False
        self.busy = 0
        # Each session's closed turns not yet sealed: (wake-up number, monotonic time).
        self.waiting: dict[int, deque[tuple[int, float]]] = {}
        self.total = 0
        self._seq = 0
        #: When an append of this store last began or committed (monotonic; written
        #: unlocked).
        self.last_append = float("-inf")

    def closed_turn(self, session_pk: int, turns: int) -> bool:
        """Turns of this session have closed: count them, and queue the session. Whether
        the worker must be woken: a worker waiting out a pause of the appends re-checks
        at its deadline anyway (a later close moves neither the pause nor the oldest age),
        so only a first queued session, or the backlog reaching half its cap, wakes it."""
        with self.lock:
            was_queued = bool(self.pending)
            now = time.monotonic()
            d = self.waiting.setdefault(session_pk, deque())
            for _ in range(turns):
                self._seq += 1
                d.append((self._seq, now))
            self.total += turns
            self.pending.add(session_pk)
            return not was_queued or 2 * self.total >= self.policy.max_backlog

    def idle(self) -> bool:
        """Nothing queued, nothing in hand."""
        with self.lock:
            return not self.pending and not self.busy

    def delay(self, now: float) -> float:
        """Seconds the worker should still yield to the appends (0: seal now)."""
        p = self.policy
        with self.lock:
            if 2 * self.total >= p.max_backlog:
                return 0.0
            oldest = min((d[0][1] for d in self.waiting.values() if d), default=now)
        return max(0.0, min(p.max_age - (now - oldest), p.quiet - (now - self.last_append)))

    def next_step(self, now: float) -> float | None:
        """0 when the worker should seal now, else how long to wait for (``None``: until
        woken); skipped sessions whose retry is due are queued again."""
        with self.lock:
            if self.retry and now >= self.retry_at:
                self.pending |= self.retry
                self.retry = set()
            waits = []
            if self.pending:
                d = self.delay(now)
                if d <= 0:
                    return 0.0
                waits.append(d)
            if self.retry:
                waits.append(self.retry_at - now)
            return min(waits) if waits else None

    def take(self, oldest_only: bool = False) -> tuple[list[int], int]:
        """Sessions to seal now, longest-waiting first (or only that one), and the mark
        that :meth:`done` is given back (the worker is busy until then)."""
        with self.lock:
            def since(pk: int) -> float:
                d = self.waiting.get(pk)
                return d[0][1] if d else float("inf")

            pks = sorted(self.pending, key=since)[: 1 if oldest_only else None]
            self.pending.difference_update(pks)
            self.busy += 1
            return pks, self._seq

    def done(self, taken: Iterable[int], mark: int, skipped: dict[int, int], untouched: set[int]) -> None:
        """The sessions taken at ``mark`` are sealed, but for ``skipped`` (tried again
        :data:`RETRY_AFTER` later; each with the turns it has left, ``-1``: unknown) and
        ``untouched`` (the worker yielded before them)."""
        with self.lock:
            now = time.monotonic()
            for pk in taken:
                if pk in untouched:
                    self.pending.add(pk)
                elif pk in skipped:
                    if not self.retry:
                        self.retry_at = now + RETRY_AFTER
                    self.retry.add(pk)
                    d = self.waiting.get(pk)
                    if d is not None and skipped[pk] >= 0:
                        # Count only the turns left, aged from now: a turn that cannot be
                        # sealed yet (rows that do not verify) must neither grow the
                        # backlog with the turns sealed after it nor keep it past max_age.
                        older = sum(1 for e in d if e[0] <= mark)
                        for _ in range(older):
                            d.popleft()
                        d.extendleft([(mark, now)] * skipped[pk])
                        self.total += skipped[pk] - older
                        if not d:
                            del self.waiting[pk]
                else:
                    # Every turn closed before the take was listed by this round: sealed
                    # (or a short one waiting for more, which is no backlog).
                    d = self.waiting.get(pk)
                    while d and d[0][0] <= mark:
                        d.popleft()
                        self.total -= 1
                    if d is not None and not d:
                        del self.waiting[pk]
            self.busy -= 1


class Sealer:
    """Seals an engine's closed turns; owns the background worker (started on first wake):
    a thread, or with ``on_loop`` a task of the running event loop."""

    def __init__(self, engine: Any, *, policy: SealPolicy | None, on_loop: bool = False) -> None:
        # `engine`: the Engine that owns this sealer (not imported: it imports this module).
        self._owner = engine
        #: When the background worker seals (``None``: no worker, only :meth:`seal` does).
        self.policy = policy
        #: Whether a worker seals in the background (else only :meth:`seal` does).
        self.background = policy is not None
        self._backlog = _Backlog(policy or SealPolicy())
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

    def _seal(self, session_pk: int | None, wait: bool, yielding: bool = False) -> tuple[int, int, bool]:
        """:meth:`seal`, how many listed turns it left unsealed (a held lock, the feed's
        barrier, a chain that does not verify; ``-1``: it stopped early, closing or
        yielding), and (``yielding``: between transactions) whether it stopped because
        the appends came back."""
        st = self._owner.storage
        failed: dict[tuple[int, int], int] = {}  # (session, turn) -> turns left
        total = 0
        while True:
            with st.read() as tx:
                listed = st.sealable_turns(tx, session_pk, _LISTED)
            todo = [t for t in _joined(listed) if (t.session_pk, t.turn) not in failed]
            if not todo:
                return total, sum(failed.values()), False
            for i in range(0, len(todo), TURNS_PER_TRANSACTION):
                if self._backlog.closed:
                    return total, -1, False
                if yielding and i and self._backlog.delay(time.monotonic()) > 0:
                    return total, -1, True
                batch = todo[i : i + TURNS_PER_TRANSACTION]
                done, stopped = self._seal_batch(batch, wait, yielding)
                total += sum(t.turns for t in done)
                self._sealed_any = self._sealed_any or bool(done)
                if stopped:
                    return total, -1, True
                failed.update(((t.session_pk, t.turn), t.turns) for t in batch if t not in done)
            if len(listed) < _LISTED:
                return total, sum(failed.values()), False  # the list was complete

    def _seal_batch(
        self, batch: Iterable[SealableTurn], wait: bool, yielding: bool = False
    ) -> tuple[list[SealableTurn], bool]:
        """Seal these turns in one transaction (then thin their sessions' snapshots); the
        turns sealed, and whether it stopped early. ``yielding``: it stops as soon as the
        store's appends are back (or the store closes), asked before each turn: an append
        that began meanwhile waits for the session's row one turn at most, not the batch
        (each turn still hashed, encoded and written in the transaction, several a batch
        while no append comes)."""
        eng = self._owner
        st = eng.storage
        backlog = self._backlog
        done: list[SealableTurn] = []
        by_session: dict[int, list[SealableTurn]] = {}
        for t in batch:
            by_session.setdefault(t.session_pk, []).append(t)
        thin: dict[int, int] = {}
        stopped = False

        def stop() -> bool:
            nonlocal stopped
            stopped = stopped or backlog.closed or backlog.delay(time.monotonic()) > 0
            return stopped

        if yielding and stop():
            return done, True  # not even a transaction (on SQLite it would take the write lock)
        with st.write() as tx:
            for pk, turns in by_session.items():
                if yielding and stop():
                    break
                row = st.session(tx, pk=pk, lock=True, wait=wait)
                if row is None:
                    continue
                hashed_as = eng.event_names(tx, [row])[row.pk]
                sealed = st.seal_turns(tx, row, turns, hashed_as, stop if yielding else None)
                if sealed and not stopped:
                    # From the first version: a round kept what was then the session's newest
                    # snapshot, and one that found the session's row held thinned nothing.
                    # (A session a stop cut short has turns left: its next round thins it.)
                    thin[pk] = sealed[-1].last
                done += sealed
        # One transaction per session: each locks only its own blobs' rows, in digest order
        # as appends do (several sessions' in one would lock them in no global order).
        every = SEALED_SNAPSHOT_SPACING * eng.snapshot_every
        for pk, last in thin.items():
            with st.write() as tx:
                if st.session(tx, pk=pk, lock=True, wait=wait) is not None:
                    st.thin_snapshots(tx, pk, first=1, last=last, keep_every=every)
        return done, stopped

    # -- the background worker ----------------------------------------------------------

    def seal_sessions(self, pks: list[int], *, yielding: bool = True) -> tuple[dict[int, int], set[int]]:
        """One round of the background worker: seal these sessions' closed turns, in this
        order, without waiting for a lock (``yielding``; an assisting append waits). Returns
        the sessions left with turns to seal (skipped for a held lock, the feed's barrier,
        or a failure, which is logged), to try again later, with how many (``-1``: not
        known), and (``yielding``) those not begun because the appends came back (the
        policy's ``quiet``)."""
        skipped: dict[int, int] = {}
        for i, pk in enumerate(pks):
            if self._backlog.closed:
                return skipped, set(pks[i:])
            if yielding and i and self._backlog.delay(time.monotonic()) > 0:
                return skipped, set(pks[i:])
            try:
                _, left, yielded = self._seal(pk, wait=not yielding, yielding=yielding)
                if yielded:
                    return skipped, set(pks[i:])
                if left:
                    skipped[pk] = left
            except EventStoreError as exc:
                _log.warning("sealing session row %d failed: %s", pk, exc)
                skipped[pk] = -1
        return skipped, set()

    def wake(self, session_pk: int, turns: int = 1) -> None:
        """Turns of this session have closed: seal them soon (never blocks, never raises)."""
        if self._backlog.closed_turn(session_pk, turns):
            self._worker.wake()

    def appended(self) -> None:
        """An append of this store has begun or committed (the worker yields to appends:
        one that began stops its transaction at the next turn)."""
        self._backlog.last_append = time.monotonic()

    def backlog(self) -> int:
        """Closed turns this store has seen close and not sealed yet."""
        return self._backlog.total

    def over_cap(self) -> bool:
        """Whether the backlog is at the policy's ``max_backlog`` (appends then assist)."""
        return self.policy is not None and self._backlog.total >= self.policy.max_backlog

    def assist(self) -> None:
        """At the backlog's cap, seal the session waiting longest now, in the caller: an
        append whose events are committed (never raises: a failure is logged and the
        session tried again later)."""
        if not self.over_cap() or self._backlog.closed:
            return
        backlog = self._backlog
        pks, mark = backlog.take(oldest_only=True)
        skipped: dict[int, int] = dict.fromkeys(pks, -1)
        try:
            skipped, _ = self.seal_sessions(pks, yielding=False)
        except Exception:  # noqa: BLE001 - the caller's append has committed: never its error
            _log.exception("sealing sessions %s failed", pks)
        finally:
            backlog.done(pks, mark, skipped, set())

    def idle(self) -> bool:
        """Whether the worker has nothing queued and nothing in hand."""
        return self._backlog.idle()

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
        self._cond = threading.Condition(self._backlog.lock)
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        with self._cond:
            if self._backlog.closed:
                return
            if self._thread is None:
                name = f"eventstore-seal {self._sealer._owner.storage.safe_url}"
                self._thread = threading.Thread(target=self._run, name=name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        backlog = self._backlog
        while True:
            with self._cond:
                while not backlog.closed:
                    wait = backlog.next_step(time.monotonic())
                    if wait == 0:
                        break
                    self._cond.wait(wait)
                if backlog.closed:
                    return
                pks, mark = backlog.take()
            skipped: dict[int, int] = {}
            untouched: set[int] = set()
            try:
                skipped, untouched = self._sealer.seal_sessions(pks)
            finally:
                backlog.done(pks, mark, skipped, untouched)

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

    def wake(self) -> None:
        if self._backlog.closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on the store's loop: the turn waits for the next wake-up
        if self._task is None:
            self._event = asyncio.Event()
            self._task = loop.create_task(self._run(), name="eventstore-seal")
        assert self._event is not None
        self._event.set()

    async def _run(self) -> None:
        backlog = self._backlog
        while not backlog.closed:
            wait = backlog.next_step(time.monotonic())
            if wait != 0:
                await self._sleep(wait)
                continue
            pks, mark = backlog.take()
            skipped: dict[int, int] = {}
            untouched: set[int] = set()
            try:
                skipped, untouched = await run(self._sealer.seal_sessions, pks)
            except Exception:  # noqa: BLE001 - a bug must not end sealing for good
                _log.exception("sealing sessions %s failed", pks)
                skipped = dict.fromkeys(pks, -1)
            finally:
                backlog.done(pks, mark, skipped, untouched)

    async def _sleep(self, timeout: float | None) -> None:
        """Until a wake-up, or ``timeout`` seconds."""
        event = self._event
        assert event is not None
        event.clear()  # no await since the loop decided to wait: no wake-up is lost
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass

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
