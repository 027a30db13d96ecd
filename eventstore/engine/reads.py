"""Reading events out: a lineage's history in chunks, following a session live, the feed.

:func:`follow_plan` and :func:`feed_plan` make a follower's plan (a
:class:`~eventstore.core.feed_rules.Live`: what to read and when to stop); :func:`drive` is
its synchronous driver, :func:`eventstore.engine.async_bridge.live` the asyncio one.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from eventstore.core.appends import history_segments, recorded, recorded_from_feed
from eventstore.core.feed_rules import (
    FEED_CHUNK,
    Bands,
    FeedKey,
    FollowState,
    Follower,
    Live,
    Pacer,
    wait_arg,
)
from eventstore.core.records import RecordedEvent
from eventstore.core.rewinds import Rewinds
from eventstore.core.rows import RewindRow, Segment
from eventstore.core.validation import MAX_VERSION
from eventstore.engine.transaction_steps import TransactionSteps
from eventstore.errors import SessionRewound, StorageError, VersionNotFound
from eventstore.storage import Storage

__all__ = ["HISTORY_CHUNK", "OpenFollowers", "iter_history", "follow_plan", "feed_plan", "feed_names", "drive"]

#: Events read per query when a history is iterated.
HISTORY_CHUNK = 1000

#: How long closing a store waits for its followers' reads still running (s).
CLOSE_TIMEOUT = 10.0


class OpenFollowers:
    """A sync store's followers not closed yet, so closing the store ends them.

    A follower left iterating in some thread (a web server's abandoned stream, say) would
    otherwise read on after the store closed, over the connections the closed pool makes
    again, and hold locks on tables its owner is about to drop. :meth:`close` closes each
    follower and waits until none is inside a step (a read, or a wait its close cuts short).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open: weakref.WeakSet[Follower] = weakref.WeakSet()
        self._stepping = 0
        self._closed = False

    def follower(self, plan: Live, storage: Storage) -> Follower:
        """A follower driving ``plan`` over ``storage``, ended by :meth:`close`."""
        with self._cond:
            if self._closed:
                raise StorageError("the store is closed", retryable=False)
            follower = Follower(self._steps(drive(plan, storage)), plan.state, storage.watcher().wake)
            self._open.add(follower)
        return follower

    def _steps(self, events: Generator[RecordedEvent, None, None]) -> Iterator[RecordedEvent]:
        try:
            while True:
                with self._cond:
                    if self._closed:
                        return
                    self._stepping += 1
                try:
                    ev = next(events, None)
                finally:
                    with self._cond:
                        self._stepping -= 1
                        self._cond.notify_all()
                if ev is None:
                    return
                yield ev
        finally:
            events.close()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Close every follower, then wait (at most ``timeout`` seconds) for the steps
        still running to end; later followers are refused."""
        with self._cond:
            self._closed = True
            followers = list(self._open)
        for f in followers:
            f.close()
        with self._cond:
            self._cond.wait_for(lambda: self._stepping == 0, timeout)


def follow_plan(
    engine: TransactionSteps, session: Any, *, after: Any = 0, idle_timeout: Any = None, state: FollowState | None = None
) -> Live:
    """What following a session reads (validated, the session looked up): the past as
    :meth:`~eventstore.engine.engine.Engine.history` gives it, then the session's own new
    events. The sync follower (:func:`drive`) and the async one drive it, each with its own
    waits."""
    v = engine.validate
    v.id(session, "session")
    start = v.count(after, "after") or 0
    idle = v.timeout(idle_timeout)
    with engine.storage.read() as tx:
        row = engine.row(tx, session)
        lineage = engine.lineage(tx, row)
        names = engine.event_names(tx, lineage)
    if start > row.head:
        raise VersionNotFound(
            row.id, start, row.head,
            f"session {row.id!r} has no version {start} to follow after (its head is {row.head})",
        )
    past = iter_history(engine.storage, history_segments(lineage, row, start, None), names, None, False)
    last = max(start, row.head)
    st = engine.storage

    def read() -> tuple[list[RecordedEvent], bool, bool]:
        nonlocal last
        # A session's versions are written under its row lock, so version v + 1 is
        # never visible before v: reading on from the last version skips nothing.
        with st.read() as tx:
            rows = st.read_events(tx, row.pk, after=last, upto=MAX_VERSION, limit=HISTORY_CHUNK)
            moved = Rewinds(st.records(tx, RewindRow, pks=(row.pk,))).by_kept.get(row.pk)
        full = len(rows) == HISTORY_CHUNK
        if moved is not None:
            # The id was rewound: what the row holds up to the old head was committed
            # before the rewind and is handed out; then the follower ends.
            rows = [e for e in rows if e.version <= moved.from_head]
            if not rows:
                raise SessionRewound(row.id, moved.to_version, moved.kept_id)
            full = True
        if rows:
            last = rows[-1].version
        return [recorded(e, row.id) for e in rows], False, full

    return Live(past, read, Pacer(idle, time.monotonic()), state or FollowState(time.time))


def feed_plan(
    engine: TransactionSteps, *, after: Any = None, idle_timeout: Any = 1.0, state: FollowState | None = None
) -> Live:
    """What the feed reads (arguments validated): pages in feed order after a position,
    below the storage's barrier. Driven like :meth:`follow_plan`."""
    key = engine.validate.position(after, "after")
    idle = engine.validate.timeout(idle_timeout)
    st = engine.storage
    bands = Bands() if st.feed_banded else None

    def read() -> tuple[list[RecordedEvent], bool, bool]:
        nonlocal key, bands
        # The key moves only once every read of the page is over (its own transaction and
        # the one naming its events) and its rows are about to be handed out: a connection
        # lost anywhere before that (a server restart) makes the retried read start from
        # the same key, not after rows it never handed out.
        after_key = None if key is None else key.as_tuple()
        if bands is None:
            page = st.read_feed(after=after_key, limit=FEED_CHUNK)
            rows, full = page.rows, len(page.rows) == FEED_CHUNK
            pending = page.pending
            last = rows[-1] if rows else None
            next_key = key
            if last is not None:
                next_key = FeedKey(last.xact, last.session_pk, last.version)
            next_bands = None
        else:
            band = st.read_feed(after=after_key, limit=bands.limit, upto=bands.upto(key))
            rows = band.rows
            upto = bands.upto(key, band.below)
            next_key, full, next_bands = bands.read(key, rows, upto, band.below)
            pending = not full and band.pending
        out = [recorded_from_feed(r) for r in rows]
        if rows:
            # Naming reads in a transaction of its own, which a restart can fail too: the
            # key must not have moved yet, or the retried read would start after the page.
            out = feed_names(engine, out, {r.session_pk for r in rows}, [r.session_pk for r in rows])
        key, bands = next_key, next_bands
        return out, pending, full

    return Live(iter(()), read, Pacer(idle, time.monotonic()), state or FollowState(time.time))


def feed_names(
    engine: TransactionSteps, events: list[RecordedEvent], pks: Iterable[int], pk_of: Sequence[int]
) -> list[RecordedEvent]:
    """Feed events named as a history names them (``pk_of``: each one's row): a
    kept line's under the id that was rewound, not the kept id."""
    with engine.storage.read() as tx:
        kept = Rewinds(engine.storage.records(tx, RewindRow, pks=set(pks))).by_kept
    if not kept:
        return events
    return [
        replace(e, session_id=kept[pk].session_id) if pk in kept else e
        for e, pk in zip(events, pk_of, strict=True)
    ]


def iter_history(
    storage: Storage, segs: list[Segment], names: dict[int, str], limit: int | None, desc: bool
) -> Iterator[RecordedEvent]:
    """The events of a lineage's segments, read :data:`HISTORY_CHUNK` at a time, each chunk
    in a read transaction of its own (``names``: the session id of each row's events)."""
    left = limit
    for seg in reversed(segs) if desc else segs:
        lo, hi = seg.after, seg.upto
        while lo < hi and (left is None or left > 0):
            size = HISTORY_CHUNK if left is None else min(left, HISTORY_CHUNK)
            with storage.read() as tx:
                rows = storage.read_events(tx, seg.session_pk, after=lo, upto=hi, limit=size, desc=desc)
            if not rows:
                break
            for e in rows:
                yield recorded(e, names[e.session_pk])
            if left is not None:
                left -= len(rows)
            if desc:
                hi = rows[-1].version - 1
            else:
                lo = rows[-1].version
            if len(rows) < size:
                break


def drive(plan: Live, storage: Storage) -> Generator[RecordedEvent, None, None]:
    """Hand out the plan's past, then what its ``read`` returns, waiting for the
    storage's change watcher between reads that reached the end (the decisions are
    the plan's; the async twin drives the same plan in :func:`eventstore.engine.async_bridge.live`)."""
    for ev in plan.past:
        if not plan.handing_out(ev):
            return
        yield ev
    plan.past_done(time.monotonic())
    watcher = storage.watcher()
    while not plan.state.closed:
        seen = watcher.generation()
        try:
            batch, pending, full = plan.read()
        except StorageError as exc:
            time.sleep(plan.retry_delay(exc, time.monotonic()))
            continue
        yield from plan.hand_out(batch)
        wait = plan.after_read(bool(batch), pending, full, time.monotonic())
        if wait is None:
            return
        if wait:
            watcher.wait(seen, wait_arg(wait))
