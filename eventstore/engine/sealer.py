"""Sealing closed turns into segments: now (``store.seal()``) or in the background.

A turn is closed once a later turn of its session has begun (its ``send`` is recorded):
nothing can be appended to it any more, and the session's newest turn — where an append
with an event id that is retried must still meet the unique index on ``events`` — stays
rows. Each closed turn's rows become one segment in the transaction that deletes them
(consecutive turns of fewer than :data:`MIN_EVENTS` events are joined into one)
(:meth:`~eventstore.storage.interface.Storage.seal_turn`), several turns per transaction,
each session's row locked while its turns are sealed so that no append interleaves.
A crash at any point leaves either the rows or the segment, never both, never neither.

The background worker is a daemon thread of the writing store, woken by the planner
when an append of this process starts a new turn. It never holds up an append: on
PostgreSQL it skips a session whose row an append holds (``SKIP LOCKED``) and tries again
on the next wake-up; and it waits for the feed's barrier to pass a turn before sealing it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from eventstore.core.rows import SealableTurn
from eventstore.errors import EventStoreError

__all__ = ["Sealer", "TURNS_PER_TRANSACTION", "RETRY_AFTER"]

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


class Sealer:
    """Seals an engine's closed turns; owns the background worker (started on first wake)."""

    def __init__(self, engine: Any, *, background: bool) -> None:
        # `engine`: the Engine that owns this sealer (not imported: it imports this module).
        self._owner = engine
        #: Whether a worker seals in the background (else only :meth:`seal` does).
        self.background = background
        self._cond = threading.Condition()
        self._pending: set[int] = set()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._busy = 0
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
        st = self._owner.storage
        failed: set[tuple[int, int]] = set()
        total = 0
        while True:
            with st.read() as tx:
                listed = st.sealable_turns(tx, session_pk, _LISTED)
            todo = [t for t in _joined(listed) if (t.session_pk, t.turn) not in failed]
            if not todo:
                return total
            for i in range(0, len(todo), TURNS_PER_TRANSACTION):
                if self._closed:
                    return total
                batch = todo[i : i + TURNS_PER_TRANSACTION]
                done = self._seal_batch(batch, wait)
                total += sum(t.turns for t in done)
                self._sealed_any = self._sealed_any or bool(done)
                failed.update((t.session_pk, t.turn) for t in batch if t not in done)
            if len(listed) < _LISTED:
                return total  # the list was complete

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
                for t in turns:
                    if st.seal_turn(tx, row, t, hashed_as):
                        done.append(t)
        return done

    # -- the background worker ----------------------------------------------------------

    def wake(self, session_pk: int) -> None:
        """A turn of this session has closed: seal it soon (never blocks)."""
        with self._cond:
            if self._closed:
                return
            self._pending.add(session_pk)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"eventstore-seal {self._owner.storage.safe_url}", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def idle(self) -> bool:
        """Whether the worker has nothing queued and nothing in hand."""
        with self._cond:
            return not self._pending and not self._busy

    def _run(self) -> None:
        retry: set[int] = set()
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    if not self._cond.wait(RETRY_AFTER if retry else None) and retry:
                        self._pending |= retry
                        retry = set()
                if self._closed:
                    return
                pks, self._pending = self._pending, set()
                self._busy += 1
            try:
                for pk in sorted(pks):
                    try:
                        self.seal(pk, wait=False)
                        with self._owner.storage.read() as tx:
                            if _joined(self._owner.storage.sealable_turns(tx, pk, _LISTED)):
                                retry.add(pk)  # skipped (a held lock, the feed's barrier)
                    except EventStoreError as exc:
                        _log.warning("sealing session row %d failed: %s", pk, exc)
                        retry.add(pk)
            finally:
                with self._cond:
                    self._busy -= 1

    def close(self) -> None:
        """Stop the worker (what it has not sealed yet is sealed by a later store)."""
        with self._cond:
            self._closed = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join()
