"""Live follow and the global feed: every decision that is not I/O, in one place.

The sync engine (:meth:`eventstore.engine.engine.Engine.follow` / :meth:`~eventstore.engine.engine.Engine.feed`)
reads rows and waits for wake-ups; what it reads next, where a position points, when to
read again, when to stop and how far behind the reader is are decided here, so an asyncio
twin only swaps the reads and the waits.

**Order and positions.** The feed's order is the key ``(xact, session_pk, version)``:

- on PostgreSQL ``xact`` is the id of the transaction that wrote the event (raised, if need
  be, to the value of the session's previous event, so one session never goes backwards).
  A transaction id is assigned *before* the transaction commits, so ids do not follow
  commit order — the classic gap: a reader that moved past id 12 would miss transaction 11
  committing later. The feed therefore reads only rows whose ``xact`` is below the oldest
  transaction that can still write an event (one holding a lock on the events table or on
  ``sessions``; see :mod:`eventstore.storage.postgres.feed_barrier`): every such row is committed,
  and no row can ever be written below that bound again. Transactions that cannot write an
  event (another database's, another table's) do not count. No lock is taken and nothing
  is ever skipped by a timer; a long-open writing transaction simply holds the feed back
  until it ends (:attr:`Follower.lag` shows it).
- on SQLite writers take turns (``BEGIN IMMEDIATE``), so ``xact`` is a number that grows in
  commit order and every committed row is final at once.

**Bands** (PostgreSQL). The index on ``xact`` is a BRIN index: a few bytes per range of
table pages instead of an entry per event, cheap because transaction ids grow with
insertion order. It finds where a band of ``xact`` values lies but cannot return rows in
order, so each page reads one band ``after <= xact <= upto`` and sorts it in memory
(:class:`Bands` sizes it). ``upto`` is always below the barrier, so every row of the band
is final: once a band came back whole (not cut by the page limit), nothing can ever be
added to it, and the next band starts above it. A page cut by its limit is resumed from
its last event, as ever. Nothing is skipped by size or by time; only the cost moves. A
range of the index not summarized yet is read whole by every band, so the writing store
summarizes complete ranges as it goes (see ``eventstore.storage.postgres.summarizer``).

The reader's key moves only after a page's read transaction has ended (on PostgreSQL the
page is one statement that reads the barrier, the band below it and whether committed rows
wait above it, in one snapshot; on SQLite the page, the end-of-page check and the commit) and
the read naming its events (a transaction of its own) has too: a connection lost anywhere in
them (a server restart) makes the retried read start from the same key, so a page is never
counted as read without being handed out.
On SQLite ``xact`` is the table's rowid: a page is a range scan of the table itself.

A position is the key of an event, written as fixed-width hex (``xact.session.version``), so
positions of one database also compare in feed order as strings. It is opaque to callers:
they store it and pass it back as ``after``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from eventstore.core.records import RecordedEvent
from eventstore.errors import InvalidEvent, StorageError

__all__ = [
    "FeedKey",
    "Bands",
    "FollowView",
    "parse_position",
    "position",
    "Pacer",
    "FollowState",
    "Follower",
    "AsyncFollower",
    "Live",
    "wait_arg",
    "FEED_CHUNK",
    "PENDING_POLL",
]

#: Events read per query while catching up.
FEED_CHUNK = 1000
#: The first band of transaction ids a banded feed reads, and the widest.
BAND_FIRST = 1024
BAND_MAX = 2**40
#: Events read per page of a banded feed: each page also pays for the ranges of the index
#: not yet summarized (read whole by every band) and for a round trip, so fewer, larger
#: pages read faster — 4,000 events: about 1 MB of rows.
BAND_PAGE = 4 * FEED_CHUNK
#: The largest page of a banded feed inside one transaction that wrote more events than a
#: page: each page of it sorts all of its rows, so its pages grow (up to this many events).
BAND_PAGE_MAX = 16 * FEED_CHUNK
#: A key above every event of its ``xact`` (session keys and versions are int4).
_KEY_END = 2**31
#: How often the feed looks again while committed events wait behind an older open
#: transaction that may never notify (one that wrote no event).
PENDING_POLL = 0.05

#: The first and the longest delay between reads that failed with a retryable error.
RETRY_FIRST = 0.1
RETRY_MAX = 2.0

#: The largest transaction id, session key and version a position can carry: positions
#: come from 64-bit transaction ids (with headroom for the bands added to them) and the
#: 32-bit session key and version columns.
MAX_XACT = 2**62
MAX_PK = 2**31 - 1
MAX_POSITION_VERSION = 2**31 - 1

# %-formatting: a third of the time of the same f-string, once per event the feed reads.
_POSITION_FORMAT = "%016x.%08x.%08x"
_POSITION = re.compile(r"([0-9a-f]{16})\.([0-9a-f]{8})\.([0-9a-f]{8})")


@dataclass(frozen=True, order=True, slots=True)
class FeedKey:
    """Where an event sits in the feed: compared as ``(xact, session_pk, version)``."""

    xact: int
    session_pk: int
    version: int

    def position(self) -> str:
        """The opaque position string of this key."""
        return position(self.xact, self.session_pk, self.version)

    def as_tuple(self) -> tuple[int, int, int]:
        """``(xact, session_pk, version)``, as storage takes it."""
        return (self.xact, self.session_pk, self.version)


def position(xact: int, session_pk: int, version: int) -> str:
    """The position string of the key ``(xact, session_pk, version)``."""
    return _POSITION_FORMAT % (xact, session_pk, version)


def parse_position(value: Any, what: str = "after") -> FeedKey | None:
    """The key of a position string (``None`` stays ``None``: the feed's start).

    Raises:
        InvalidEvent: ``value`` is not a position this store hands out.
    """
    if value is None:
        return None
    m = _POSITION.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise InvalidEvent(
            f"{what} must be a feed position (as an event's `position` gives it) or None, got {value!r}",
            field=what,
        )
    key = FeedKey(int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16))
    # The format has room for more than the store ever hands out: a forged key beyond the
    # columns' range must be refused here, not reach the database as an overflow.
    if key.xact > MAX_XACT or key.session_pk > MAX_PK or key.version > MAX_POSITION_VERSION:
        raise InvalidEvent(
            f"{what} is not a feed position this store hands out (out of range): {value!r}",
            field=what,
        )
    return key


@dataclass(frozen=True, slots=True)
class Bands:
    """How wide a band of ``xact`` each page of a banded feed reads (see the module notes).

    The aim is a band of about one page of events: the band grows (doubles) while bands
    come back less than half full — also through long stretches of transaction ids that
    wrote no event — and shrinks to the span of ids the page's rows covered when a band
    was cut by it. A page that one transaction filled alone is followed by a larger one
    (``limit`` doubles, up to :data:`BAND_PAGE_MAX`), since every page of that transaction
    reads and sorts all of its rows.

    A value: :meth:`read` returns the sizes of the next band instead of changing these, so
    a reader takes the next key and sizes together, once the page is safely read.
    """

    #: how many transaction ids the next band spans at most
    width: int = BAND_FIRST
    #: how many events the next page reads at most
    limit: int = BAND_PAGE

    def upto(self, after: FeedKey | None, below: int | None = None) -> int:
        """The top of the next band after ``after``, below the barrier ``below`` (``None``:
        the read applies the barrier itself)."""
        start = -1 if after is None else after.xact
        return start + self.width if below is None else min(start + self.width, below - 1)

    def read(
        self, after: FeedKey | None, rows: list[Any], upto: int, below: int
    ) -> tuple[FeedKey | None, bool, Bands]:
        """A band was read (with :attr:`limit`): where the next one starts, whether to read
        again at once, and the sizes of the next band.

        Args:
            after: the key the band was read after.
            rows: what it returned (storage rows with ``xact``, ``session_pk``, ``version``).
            upto: its top; ``below``: the barrier it was read under.
        """
        start = -1 if after is None else after.xact
        if len(rows) >= self.limit:
            last = rows[-1]
            limit = min(2 * self.limit, BAND_PAGE_MAX) if last.xact == start else BAND_PAGE
            cut = FeedKey(last.xact, last.session_pk, last.version)
            # The span its rows covered, not the band's: a band that began in a stretch of
            # ids without events (the first one) would stay as wide.
            return cut, True, Bands(max(1, last.xact - rows[0].xact), limit)
        width = min(self.width * 2, BAND_MAX) if 2 * len(rows) < self.limit else self.width
        done = FeedKey(upto, _KEY_END, _KEY_END)  # the whole band is handed out
        if after is not None and after >= done:
            done = after
        return done, upto < below - 1, Bands(width)


class Pacer:
    """When a follower reads again, and when it stops.

    Args:
        idle_timeout: stop after this many seconds without an event (``None``: never).
        now: the monotonic time the follower started.
    """

    def __init__(self, idle_timeout: float | None, now: float) -> None:
        self.idle_timeout = idle_timeout
        self.last_event = now
        self._backoff = RETRY_FIRST

    def failed(self, now: float, retryable: bool) -> float | None:
        """A read failed: seconds to wait before reading again, or ``None`` to give up
        (re-raise) — when the error is not retryable, or the idle timeout has passed.

        A follower outlives a server restart: retryable failures (connection lost, server
        starting) are retried with a growing delay for as long as it would have waited.
        """
        left = self.next_wait(now, pending=False)
        if not retryable or left is None:
            return None
        wait = min(left, self._backoff)
        self._backoff = min(self._backoff * 2, RETRY_MAX)
        return wait

    def recovered(self) -> None:
        """A read succeeded (the retry delay starts small again)."""
        self._backoff = RETRY_FIRST

    def saw_event(self, now: float) -> None:
        """An event was handed out at ``now`` (the idle clock restarts)."""
        self.last_event = now

    def next_wait(self, now: float, *, pending: bool) -> float | None:
        """How long to wait for a wake-up before reading again.

        Returns:
            Seconds (``inf``: no limit), or ``None`` when the idle timeout has passed
            and the follower stops.
        """
        left = float("inf")
        if self.idle_timeout is not None:
            left = self.last_event + self.idle_timeout - now
            if left <= 0:
                return None
        return min(left, PENDING_POLL) if pending else left


class FollowState:
    """What a follower has handed out so far, and how far behind it is.

    Args:
        clock: wall-clock seconds since the epoch (the engine passes ``time.time``; the
            core reads no clock of its own).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        #: the last event handed out (set by the reader loop, with ``caught_up = False``).
        self.last: RecordedEvent | None = None
        self.caught_up = False
        self.closed = False

    def reached_end(self) -> None:
        """The last read found nothing newer: the follower is caught up."""
        self.caught_up = True

    @property
    def position(self) -> str | None:
        """The feed position of the last event handed out, if any."""
        return None if self.last is None else self.last.position

    @property
    def version(self) -> int | None:
        """The version of the last event handed out, if any."""
        return None if self.last is None else self.last.version

    @property
    def lag(self) -> float:
        """Seconds between now and the recording of the last event handed out while the
        follower is still behind; ``0.0`` once a read found nothing newer."""
        if self.caught_up or self.last is None:
            return 0.0
        return max(0.0, self._clock() - self.last.recorded_at.timestamp())


class FollowView:
    """What a follower tells about itself (shared by :class:`Follower` and
    :class:`AsyncFollower`); see :class:`Follower` for the attributes."""

    _state: FollowState

    @property
    def lag(self) -> float:
        """Seconds since the last handed-out event was recorded (``0.0`` once caught up)."""
        return self._state.lag

    @property
    def caught_up(self) -> bool:
        """The last read found nothing newer."""
        return self._state.caught_up

    @property
    def position(self) -> str | None:
        """The feed position of the last event handed out."""
        return self._state.position

    @property
    def version(self) -> int | None:
        """The version of the last event handed out."""
        return self._state.version


class Follower(FollowView, Iterator[RecordedEvent]):
    """What :meth:`~eventstore.EventStore.follow` and :meth:`~eventstore.EventStore.feed`
    return: an iterator of :class:`~eventstore.RecordedEvent` that also tells how far
    behind it is.

    Attributes:
        lag: seconds between now and the recording of the last event handed out, while
            more are known to be waiting; ``0.0`` once it has caught up.
        caught_up: the last read found nothing newer (the follower is live).
        position: the feed position of the last event handed out (``None`` for
            :meth:`~eventstore.EventStore.follow`, or before the first event).
        version: the version of the last event handed out.
    """

    def __init__(
        self, events: Iterator[RecordedEvent], state: FollowState, wake: Callable[[], None] = lambda: None
    ) -> None:
        self._events = events
        self._state = state
        self._wake = wake

    def __iter__(self) -> Follower:
        return self

    def __next__(self) -> RecordedEvent:
        return next(self._events)

    def close(self) -> None:
        """Stop following: the iterator ends and nothing stays open.

        Safe to call from another thread while one is blocked waiting for the next event:
        that thread wakes up and its loop ends (``StopIteration``).
        """
        self._state.closed = True
        self._wake()
        close = getattr(self._events, "close", None)
        if close is not None:
            try:
                close()
            except ValueError:  # running in another thread: it sees `closed` and stops
                pass

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Live:
    """A follower's plan, the same for the sync and the async driver.

    Attributes:
        past: events to hand out first (a follow's history; empty for the feed).
        read: reads the next batch: ``(events, pending, full)`` — ``pending``: committed
            events wait behind an older open transaction (look again soon); ``full``: the
            batch hit its size limit (read again at once).
        pacer: when to read again and when to stop.
        state: what has been handed out (``lag``, ``position``, ``closed``).
    """

    past: Iterator[RecordedEvent]
    read: Callable[[], tuple[list[RecordedEvent], bool, bool]]
    pacer: Pacer
    state: FollowState
    #: the follower was closed while a batch was handed out: the driver stops.
    stopped: bool = field(default=False, init=False)

    def handing_out(self, event: RecordedEvent) -> bool:
        """``event`` is about to be handed out; ``False`` when the follower was closed."""
        if self.state.closed:
            return False
        self.state.last, self.state.caught_up = event, False
        return True

    def hand_out(self, batch: list[RecordedEvent]) -> Iterator[RecordedEvent]:
        """A successful read's events, each as it is handed out, until the follower is
        closed (then :attr:`stopped`, and :meth:`after_read` says stop)."""
        self.read_ok()
        for ev in batch:
            if not self.handing_out(ev):
                self.stopped = True
                return
            yield ev

    def past_done(self, now: float) -> None:
        """The past is handed out: the idle clock starts."""
        self.pacer.saw_event(now)

    def after_read(self, got: bool, pending: bool, full: bool, now: float) -> float | None:
        """What to do after a batch was handed out: ``None`` stop; ``0.0`` read again at
        once; otherwise wait for a wake-up at most that many seconds (``inf``: no limit).

        ``closed`` is set before the wake-up: seen here as false, the wake-up is still to
        come and moves the watcher's generation past the one noted before the read.
        """
        if self.stopped:
            return None
        if got:
            self.pacer.saw_event(now)  # the idle clock only runs while waiting
        if full:
            return 0.0
        if not pending:
            self.state.reached_end()
        wait = self.pacer.next_wait(now, pending=pending)
        return None if wait is None or self.state.closed else wait

    def after_failure(self, retryable: bool, now: float) -> float | None:
        """A read failed: seconds to sleep before reading again, or ``None`` to re-raise."""
        return self.pacer.failed(now, retryable)

    def retry_delay(self, exc: StorageError, now: float) -> float:
        """A read failed with ``exc``: seconds to sleep before reading again.

        Raises:
            StorageError: ``exc`` itself, when it is not worth another read
                (:meth:`after_failure` says ``None``).
        """
        delay = self.after_failure(exc.retryable, now)
        if delay is None:
            raise exc
        return delay

    def read_ok(self) -> None:
        """A read succeeded."""
        self.pacer.recovered()


def wait_arg(wait: float) -> float | None:
    """A wait from :meth:`Live.after_read` as a watcher's timeout (``None``: no limit)."""
    return None if wait == float("inf") else wait


class AsyncFollower(FollowView, AsyncIterator[RecordedEvent]):
    """The async twin of :class:`Follower`: ``async for ev in follower``, with the same
    ``lag``, ``caught_up``, ``position`` and ``version``; ``await follower.aclose()`` (or
    ``close()`` from anywhere on the loop) stops it."""

    def __init__(self, events: AsyncIterator[RecordedEvent], state: FollowState, wake: Callable[[], None]) -> None:
        self._events = events
        self._state = state
        self._wake = wake

    def __aiter__(self) -> AsyncFollower:
        return self

    async def __anext__(self) -> RecordedEvent:
        return await self._events.__anext__()

    def close(self) -> None:
        """Stop following: a task waiting for the next event wakes up and its loop ends."""
        self._state.closed = True
        self._wake()

    async def aclose(self) -> None:
        """Stop following and release the iterator."""
        self.close()
        closing = getattr(self._events, "aclose", None)
        if closing is not None:
            try:
                await closing()
            except RuntimeError:  # running in another task: it sees `closed` and stops
                pass
