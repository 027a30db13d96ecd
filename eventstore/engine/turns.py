"""Streaming turns on a synchronous engine: writing a turn's parts as they stream.

Persist before stream, group commit and stop; crash recovery and closing a session are
:mod:`eventstore.engine.turn_recovery`.

A :class:`TurnWriter` belongs to one store. Each open :class:`StreamingTurn` buffers its parts in a
:class:`~eventstore.core.turn_rules.TurnState`; background threads (the *flushers*) commit
the buffered events of every open turn together, in one transaction per flush
(:meth:`~eventstore.storage.interface.Storage.append`), each session still appended at
its exact head. Parts that end a step wake a flusher at once and ``write`` returns only
when they are durable; deltas wait at most ``max_delay``. A turn's opening ``send`` joins
the same group commit when this process knows the session's head.

A turn owns its session's stream through a *writer lease* (``sessions.writer``), taken
in the transaction that stores the opening ``send``, renewed by every flush (and by an
idle check at least every second), and checked by every flush: a turn whose lease was
taken away (crash recovery decided its writer was dead) can never write again. The batch
that ends the turn's run (its own ``finish``, ``error`` or ``stop``) gives the lease up, so
leaving the turn costs no commit of its own.

Every decision is in :mod:`eventstore.core.turn_rules`; this module only waits and does I/O.
What the sync writer shares with the asyncio one (:mod:`eventstore.engine.async_turns`) is
:class:`TurnWriterBase`.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any

from eventstore.core.appends import event_rows, head_after
from eventstore.core.catalogue import effect as catalogue_effect
from eventstore.core.codec import encode_action
from eventstore.core.rows import SessionRow, TurnBatch
from eventstore.core.turn_rules import (
    INTERRUPTION,
    MAX_PENDING,
    Pending,
    TurnState,
    event_id,
    opening_action,
    turn_action,
)
from eventstore.engine.engine import Engine
from eventstore.engine.transaction_steps import now_micros
from eventstore.engine.planner import AppendPlan
from eventstore.errors import EventStoreError, InvalidEvent, StorageError, TurnBusy

__all__ = [
    "DEFAULT_MAX_DELAY",
    "LOCKED_OPENINGS",
    "Opening",
    "StreamingTurn",
    "TurnView",
    "TurnWriter",
    "TurnWriterBase",
    "claiming_turn",
    "flush_error",
    "open_locked",
    "prepare_opening",
]

#: How long a text or reasoning delta may wait before it is durable, by default.
DEFAULT_MAX_DELAY = 0.02
# A flush that failed with a retryable error is retried this often, then the turn fails.
_RETRIES = 8
# Flusher threads per store (benchmarks/RESULTS.md: two sustain more than one; more than
# two measured no better on 2 CPUs).
FLUSHERS = 2
_RETRY_DELAY = 0.05
# Openings that take the session's lock (a session this process has not written yet), at
# once per store: a burst of them (every session's first turn after a start) otherwise
# opens as many connections and transactions as there are sessions, and the group commit
# of the turns already streaming waits behind them (benchmarks/RESULTS.md).
LOCKED_OPENINGS = 4
# A waiting writer re-checks its turn at least this often (a safety net: every change to a
# turn is signalled to its own condition).
_WAIT_CHECK = 1.0


def check_max_delay(value: Any) -> float:
    """``max_delay`` as a float: a finite number of seconds in ``0..60``.

    Raises:
        InvalidEvent: it is not.
    """
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= 60:
        raise InvalidEvent(
            f"max_delay must be a number of seconds in 0..60, got {value!r}", field="max_delay"
        )
    return float(value)


class TurnWriterBase:
    """What the sync and the async turn writer share: the open turns, their bookkeeping,
    the checks of a part, and the flusher's choice of work. The two differ only in how
    they wait (threading conditions and threads, or an :class:`asyncio.Condition` and a
    task); callers hold the writer's lock (sync) or run on the loop (async)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._turns: list[TurnState] = []
        self._attempts: dict[str, int] = {}
        self._closing = False

    def _delist(self, state: TurnState) -> None:
        self._turns.remove(state)
        self.engine.planner.reserve(-1)

    def _enlist(self, state: TurnState) -> None:
        if self._closing:
            raise StorageError("the store is closed")
        self._turns.append(state)
        self.engine.planner.reserve(1)

    def _encode(self, action: dict[str, Any], native: Any) -> tuple[tuple[str, bytes], bytes | None]:
        """A part's ``(type, payload)`` and native bytes, their sizes checked."""
        encoded = encode_action(action)
        self.engine.validate.size(encoded[1], "the part")
        return encoded, self.engine.validate.native(native)

    @staticmethod
    def _raise_if_over(state: TurnState, *, finished_ok: bool = False) -> None:
        problem = state.problem(finished_ok=finished_ok)
        if problem is not None:
            raise problem

    def _next_flush(self, now: float) -> tuple[list[TurnState], float | None]:
        """What the flusher does now: ``(turns whose buffer must be flushed now, None)``
        (when closing: every one with parts; none left: the flusher ends), or ``([], when it
        must look again at the latest)`` (monotonic)."""
        due = [t for t in self._turns if t.due(now) or (self._closing and t.joins_flush(now))]
        if due or self._closing:
            return due, None
        return due, min((t.wake_at(now) for t in self._turns), default=now + 1.0)

    def _work(self, due: list[TurnState], now: float) -> list[tuple[TurnState, list[Pending], bool]]:
        """The flush of ``due``: everything buffered by every open turn, due or not, taken
        out of the buffers, in session order (rows are locked in one order)."""
        due = due + [t for t in self._turns if t not in due and t.joins_flush(now)]
        return [(t, *t.take()) for t in sorted(due, key=lambda t: t.row.pk)]


def flush_error(exc: Exception) -> EventStoreError:
    """The error a failed flush gives each of its turns (never a bare driver exception)."""
    return exc if isinstance(exc, EventStoreError) else StorageError(f"turn flush failed: {exc!r}")


class TurnWriter(TurnWriterBase):
    """The group committer of one store: open turns and the flusher thread.

    Thread safety: turns may be written from any thread; one lock guards every
    :class:`TurnState`; conditions on it wake the flusher, and each turn's waiting writer
    (``TurnState.waiter``).
    """

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        self._locked_openings = threading.BoundedSemaphore(LOCKED_OPENINGS)
        # When each sleeping flusher wakes up next (monotonic), by thread id.
        self._sleeping: dict[int, float] = {}

    # -- opening ------------------------------------------------------------------------

    def open(self, session: Any, send_action: Any, *, actor: Any, max_delay: Any) -> TurnState:
        """Store the opening action and take the session's writer lease, in one
        transaction; return once that is durable.

        When this process wrote the session last, the opening joins the group commit
        (the next flush stores it, conditional on the head and on no turn holding the
        lease); otherwise, or when that condition fails, it takes the session's lock.

        Raises:
            InvalidEvent: an argument is malformed.
            SessionClosed: the session is closed.
            TurnBusy: another turn holds the session's lease.
        """
        opening = prepare_opening(
            self.engine, session, send_action, actor=actor, max_delay=max_delay
        )
        state = claiming_turn(self.engine, opening)
        if state is not None:
            with self._lock:
                self._enlist(state)
                self._wake.notify()
                try:
                    self._wait(state, 0)
                finally:
                    if state.durable < 0:  # refused (or failed): not a turn
                        self._delist(state)
            if not state.refused:
                return state
        with self._locked_openings:
            state = open_locked(self.engine, opening)
        with self._lock:
            self._enlist(state)
        return state

    def _enlist(self, state: TurnState) -> None:
        # Called with the lock held (as _delist is).
        state.waiter = threading.Condition(self._lock)
        super()._enlist(state)
        if not self._threads:
            # FLUSHERS threads share the work: one builds and sends a flush while another
            # waits for its commit; a turn with a flush in flight is never taken by another.
            for i in range(FLUSHERS):
                t = threading.Thread(target=self._run, name=f"eventstore-turns-{i}", daemon=True)
                t.start()
                self._threads.append(t)

    # -- writing ------------------------------------------------------------------------

    def add(
        self,
        state: TurnState,
        action: dict[str, Any],
        *,
        release: bool = False,
        native: Any = None,
    ) -> Pending:
        """Buffer one validated action (waiting while the buffer is full); wait until it
        is durable when it ends a step. ``native``: its provider-native data, unvalidated.

        Raises:
            TurnStopped, SessionClosed: the turn is over.
            StorageError: the database failed for good.
        """
        encoded, native_bytes = self._encode(action, native)
        with self._lock:
            while not state.over and state.buffered >= MAX_PENDING:
                state.waiter.wait(_WAIT_CHECK)
            self._raise_if_over(state)
            now = time.monotonic()
            first = not state.pending
            p = state.add(action, encoded[0], encoded[1], now, native_bytes)
            state.release = state.release or release
            # Wake the flusher only when it would otherwise sleep past this part's deadline.
            if (
                p.urgent
                or release
                or (first and now + state.max_delay < min(self._sleeping.values(), default=now))
            ):
                self._wake.notify()
            if state.must_wait(p, release, now):
                self._wait(state, p.seq)
        return p

    def flush(self, state: TurnState) -> int:
        """Wait until everything written so far is durable; the head version.

        Raises:
            TurnStopped, SessionClosed: a stop from elsewhere (or a close) ended the turn.
            StorageError: the database failed for good.
        """
        with self._lock:
            if state.pending:
                state.wanted = state.last_seq
                self._wake.notify()
            self._wait(state, state.last_seq)
            if not state.own_stop:
                self._raise_if_over(state, finished_ok=True)
            return state.row.head

    def finish(self, state: TurnState, *, interrupted: bool) -> None:
        """End a turn: flush what is buffered (with the interruption part when the block
        failed) and give the lease up; a turn already over only gives the lease up."""
        try:
            with self._lock:
                alive = not state.over
            if alive:
                try:
                    if interrupted:
                        self.add(state, dict(INTERRUPTION), release=True)
                    else:
                        with self._lock:
                            if not state.leave():
                                self._wake.notify()
                                self._wait(state, state.last_seq, until_finished=True)
                except EventStoreError:
                    if not interrupted:
                        raise
            with self._lock:
                needs_release = state.leased and not state.finished
            if needs_release:
                release_lease(self.engine, state)
        finally:
            with self._lock:
                if state in self._turns:
                    self._delist(state)

    def _wait(self, state: TurnState, seq: int, *, until_finished: bool = False) -> None:
        # Called with the lock held.
        while not state.over and (state.durable < seq or (until_finished and not state.finished)):
            state.waiter.wait(_WAIT_CHECK)
        if state.durable < seq:
            self._raise_if_over(state)

    # -- the flusher ----------------------------------------------------------------------

    def _run(self) -> None:
        me = threading.get_ident()
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    due, wake = self._next_flush(now)
                    if wake is None:
                        break
                    self._sleeping[me] = wake
                    self._wake.wait(max(wake - now, 0.0005))
                    del self._sleeping[me]
                if not due and self._closing:
                    return
                work = self._work(due, now)
            try:
                flush_turns(self.engine, self._lock, work, self._attempts)
            except Exception as exc:  # noqa: BLE001 - never leave a writer waiting forever
                err = flush_error(exc)
                with self._lock:
                    for t, _, _ in work:
                        t.failed(err)
            with self._lock:
                # Only the turns of this flush changed: waking every waiting writer at each
                # flush costs a thread switch per open turn (many at W = 64).
                for t, _, _ in work:
                    t.waiter.notify_all()

    def close(self) -> None:
        """Stop the flusher once every open turn's buffer is written."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=30)


class TurnView:
    """What a streaming turn tells about itself, sync or async (its :class:`TurnState`)."""

    #: How to use the turn, for the error when it is used before being entered.
    _usage = "with store.turn(...) as turn:"
    _state: TurnState | None

    def _open(self) -> TurnState:
        if self._state is None:
            raise InvalidEvent(f"the turn is not open: use it as `{self._usage}`")
        return self._state

    @property
    def session(self) -> str:
        """The session id."""
        return self._open().session

    @property
    def version(self) -> int:
        """The newest head version this turn knows to be durable (first: the send's)."""
        return self._open().row.head

    @property
    def opened_at(self) -> int:
        """The version of the action that opened the turn."""
        return self._open().opened

    @property
    def stopped(self) -> bool:
        """Whether a stop (this turn's own, or appended by anyone else), crash recovery or
        a close ended the turn."""
        return self._open().stopped

    @property
    def dropped(self) -> int:
        """How many written parts were dropped because the turn stopped first."""
        return self._open().dropped


class StreamingTurn(TurnView):
    """One streaming turn, as ``store.turn(...)`` returns it (a context manager).

    Entering stores the opening action (durable when ``__enter__`` returns) and takes the
    session's writer lease; leaving flushes and gives the lease up. Leaving with an
    exception also appends the interruption part (an ``error`` part, so no call stays
    open) unless the turn was already stopped, and re-raises.
    """

    def __init__(
        self, writer: TurnWriter, session: Any, send_action: Any, *, actor: Any, max_delay: Any
    ) -> None:
        self._writer = writer
        self._args = (session, send_action, actor, max_delay)
        self._state = None

    def __enter__(self) -> StreamingTurn:
        session, send_action, actor, max_delay = self._args
        if self._state is not None:
            raise InvalidEvent("a turn can be entered only once")
        self._state = self._writer.open(session, send_action, actor=actor, max_delay=max_delay)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._writer.finish(self._open(), interrupted=exc_type is not None)

    def write(self, part: Mapping[str, Any] | Any, native: Any = None) -> None:
        """Write one stream part (wrapped as a ``part`` action) or one action
        (``toolPhase``, ``stop``, a ``part`` with ``within``).

        ``native`` is the event's provider-native data, as one entry of
        :meth:`EventStore.append <eventstore.EventStore.append>`'s ``native`` (JSON text
        kept byte for byte, or a JSON value; ``None`` for none).

        Returns at once for text and reasoning deltas (durable within ``max_delay``); for
        ``tool-call``, ``tool-result``, ``tool-error``, ``finish``, ``error``, ``toolPhase``
        and ``stop``, only once it is durable.

        Raises:
            InvalidEvent: the part (or ``native``) is malformed (nothing is buffered).
            TurnStopped: the turn was stopped.
            SessionClosed: the session was closed.
            StorageError: the database failed for good.
        """
        state = self._open()
        action = turn_action(part, self._writer.engine.validate.limits.max_event_bytes)
        self._writer.add(state, action, native=native)

    def flush(self) -> int:
        """Make everything written so far durable; the head version.

        Raises:
            TurnStopped: a stop from elsewhere ended the turn (buffered parts were dropped).
            SessionClosed, StorageError: as for :meth:`write`.
        """
        return self._writer.flush(self._open())

    def stop(self) -> int:
        """Flush, then append a ``stop`` (open calls are cancelled); the stop's version.

        Raises:
            TurnStopped, SessionClosed, StorageError: as for :meth:`write`.
        """
        state = self._open()
        self._writer.add(state, {"type": "stop"})
        return state.row.head


@dataclass(frozen=True, slots=True)
class Opening:
    """A validated request to open a turn (see :func:`prepare_opening`)."""

    session: str
    action: dict[str, Any]
    type: str
    payload: bytes
    actor: str | None
    max_delay: float
    token: str


def prepare_opening(
    engine: Engine, session: Any, send_action: Any, *, actor: Any, max_delay: Any
) -> Opening:
    """Validate the arguments of entering a turn and draw its lease token (no I/O).

    Raises:
        InvalidEvent: an argument is malformed.
    """
    v = engine.validate
    v.id(session, "session")
    v.optional_id(actor, "actor")
    delay = check_max_delay(max_delay)
    action = opening_action(send_action, v.limits.max_event_bytes)
    type_, payload = encode_action(action)
    v.size(payload, "the send action", field="send_action")
    token = "t" + uuid.uuid4().hex[:16]
    return Opening(session, action, type_, payload, actor, delay, token)


def claiming_turn(engine: Engine, opening: Opening) -> TurnState | None:
    """A turn whose first flush stores the opening action and takes the lease, in the
    group commit, when this process wrote the session last (it knows the head); else
    ``None``. The flush writes it only if that head is still the session's and no turn
    holds the lease; otherwise the turn is ``refused`` and :func:`open_locked` decides."""
    known = engine.planner.take_head(opening.session)
    if known is None:
        return None
    now = time.monotonic()
    o = opening
    state = TurnState(o.session, known, o.token, o.actor, o.max_delay, now)
    state.opening(o.action, o.type, o.payload, now)
    return state


def open_locked(engine: Engine, opening: Opening) -> TurnState:
    """Store a turn's opening action and take the session's writer lease, in one
    transaction holding the session's lock (the I/O of entering a turn when the group
    commit cannot, shared by the sync and async writers).

    Raises:
        SessionClosed: the session is closed.
        TurnBusy: another turn holds the session's lease.
    """
    eng = engine
    st = eng.storage
    o = opening
    now = now_micros()
    with st.write(session=o.session) as tx:
        row = eng.lock_for_append(tx, o.session)
        control = eng.check_open(tx, row)
        if control.writer is not None:
            raise TurnBusy(o.session, max(0, now - (control.writer_seen or now)) / 1e6)
        rows, prev, turn, plan = eng.write_locked(
            tx, row, [o.action], [(o.type, o.payload)], (event_id(o.token, 0),), o.actor, None, now
        )
        st.update_session(tx, row.pk, writer=(o.token, now))
    head = head_after(row, rows[-1].version, prev, turn)
    eng.planner.committed(head, plan)
    eng.sealer.assist()  # the send closed the turn before: the backlog's bound (SealPolicy)
    return TurnState(o.session, head, o.token, o.actor, o.max_delay, time.monotonic())


def flush_turns(
    engine: Engine,
    lock: AbstractContextManager[Any],
    work: list[tuple[TurnState, list[Pending], bool]],
    attempts: dict[str, int],
) -> None:
    """Write the taken batches of several turns in one group commit and record the
    outcome in each :class:`TurnState` (under ``lock``); read and reconcile the turns whose
    head check failed. The I/O of a flush, shared by the sync and async writers.
    """
    eng = engine
    st = eng.storage
    now_us = now_micros()
    batches: list[TurnBatch] = []
    heads: list[tuple[SessionRow, AppendPlan | None]] = []
    sent: list[tuple[TurnState, list[Pending], bool]] = []  # the work with a batch in ``batches``
    for t, items, release in work:
        row = t.row
        # Every batch of this turn checks the head it saw and the lease it holds.
        batch = partial(
            TurnBatch,
            row.pk,
            row.head,
            row.head_hash,
            t.token,
            now_us,
            release=release,
            claim=not t.leased,
        )
        if not items:
            batches.append(batch((), row.head_turn))  # renews the lease, checks the head
            heads.append((row, None))
            sent.append((t, items, release))
            continue
        # Only the batch's last event carries an id: a batch lands whole or not at all,
        # so that id tells a retry how far an unacknowledged attempt got.
        ids: list[str | None] = [None] * (len(items) - 1) + [event_id(t.token, items[-1].seq)]
        natives = [p.native for p in items]
        rows, prev, turn = event_rows(
            row,
            t.session,
            [(p.type, p.payload) for p in items],
            ids,
            t.actor,
            None,
            now_us,
            natives if any(n is not None for n in natives) else None,
        )
        actions = [p.action for p in items]
        plan = eng.planner.plan(row, actions, rows[-1].version)
        if plan is None:
            with st.read() as tx:
                fresh = st.session(tx, id=t.session)
                if fresh is None:
                    gone: Exception | None = eng.missing(tx, t.session)
                else:
                    gone, base = None, eng.state_at(tx, fresh, row.head)
            if gone is not None:
                with lock:
                    t.failed(gone)  # erased under the live turn
                continue
            plan = eng.planner.plan(row, actions, rows[-1].version, base)
            assert plan is not None
        batches.append(
            batch(rows, turn, plan.snapshots, plan.blobs, effect=catalogue_effect(actions, now_us))
        )
        heads.append((head_after(row, rows[-1].version, prev, turn), plan))
        sent.append((t, items, release))
    if not batches:
        return
    try:
        written = st.append(batches)
    except StorageError as exc:
        now = time.monotonic()
        with lock:
            for t, _, _ in sent:
                n = attempts.get(t.token, 0) + 1
                attempts[t.token] = n
                if exc.retryable and n <= _RETRIES:
                    t.retry_later(now, _RETRY_DELAY * n)
                else:
                    t.failed(exc)
        return
    now = time.monotonic()
    stale: list[TurnState] = []
    with lock:
        for (t, _, release), ok, (head, plan) in zip(sent, written, heads):
            attempts.pop(t.token, None)
            if ok:
                t.written(head, now, release)
                if plan is not None:
                    eng.planner.committed(head, plan)
            else:
                stale.append(t)
    for t in stale:
        with st.read() as tx:
            if st.session(tx, id=t.session) is None:
                # Erased (or deleted) under the live turn: the turn ends with the error a
                # reader of the session gets, not a storage failure.
                missing = eng.missing(tx, t.session)
                with lock:
                    t.failed(missing)
                continue
            control = st.controls(tx, t.row.pk)[t.row.pk]
            after = (
                st.read_events(tx, t.row.pk, after=t.row.head, upto=control.head)
                if control.head > t.row.head
                else []
            )
        with lock:
            t.reconcile(control, after, time.monotonic())


def release_lease(engine: Engine, state: TurnState) -> None:
    """Give up a turn's lease directly (a turn that stopped: its head check would fail)."""
    with engine.storage.write() as tx:
        engine.storage.update_session(tx, state.row.pk, writer=(None, None), only_if=state.token)
