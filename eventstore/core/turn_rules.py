"""The pure half of streaming turns: what to flush, when, and what a foreign event means.

No storage, no clock, no threads: the synchronous turn writer
(:mod:`eventstore.engine.turns`) and an asyncio twin drive the same :class:`TurnState`,
passing in the time and the rows they read, so the two differ only in how they wait and
how they reach the database.

A turn's send and the last event of each of its flushes get deterministic ids,
``<token>.<seq>`` (the send is ``.0``; a batch lands whole or not at all), so a flush
retried after a lost connection finds what its first attempt wrote instead of writing it
twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from eventstore.core.appends import head_after
from eventstore.core.codec import canonical
from eventstore.core.models import WireModel, parse_actions
from eventstore.core.records import SessionInfo, to_datetime
from eventstore.core.text import iso
from eventstore.core.rows import EventRow, SessionControl, SessionRow
from eventstore.errors import InvalidEvent, SessionClosed, TurnStopped

__all__ = [
    "FLUSH_AT",
    "HEARTBEAT_SECONDS",
    "IDLE_CHECK_SECONDS",
    "INTERRUPTED",
    "INTERRUPTION",
    "MAX_PENDING",
    "Pending",
    "RecoveryStatus",
    "TurnState",
    "ends_run",
    "event_id",
    "is_urgent",
    "opening_action",
    "recovery_status",
    "session_info",
    "turn_action",
    "writer_stale",
]

#: The error text of the part that closes an interrupted turn (crash recovery, or a turn
#: left with an exception); the audit report shows such a turn as *interrupted*.
INTERRUPTED = "The response was interrupted."
#: The action appended to close an interrupted turn: an error part cancels every open call.
INTERRUPTION: dict[str, Any] = {"type": "part", "part": {"type": "error", "error": INTERRUPTED}}

#: A turn with nothing to write still checks its session (a stop from elsewhere, a lost
#: lease) and renews its lease this often; crash recovery's ``stale_after`` must exceed it.
HEARTBEAT_SECONDS = 1.0
#: An idle turn checks its session at most this often (a writing turn checks at every flush).
IDLE_CHECK_SECONDS = 0.25
#: Events a turn may buffer before ``write`` waits for a flush (backpressure).
MAX_PENDING = 1024
#: A turn with this many buffered events is flushed without waiting for ``max_delay``.
FLUSH_AT = 256

# Parts that end a step: durable before ``write`` returns.
_STEP_END_PARTS = frozenset({"tool-call", "tool-result", "tool-error", "finish", "error"})
_ACTION_TYPES = frozenset({"send", "part", "toolPhase", "stop", "retry", "reset"})
_IN_TURN = frozenset({"part", "toolPhase", "stop"})


def _validated(action: Any, max_bytes: int | None) -> dict[str, Any]:
    # parse_actions: its fast path (one pydantic-core call, no error paths built) is about
    # 3x cheaper than parse_action for a well-formed action, the common case.
    try:
        return parse_actions([action], max_bytes=max_bytes)[0].to_json()
    except InvalidEvent as exc:
        raise InvalidEvent(exc.reason, field=exc.field) from None  # one action, no index


def turn_action(part: Any, max_bytes: int | None = None) -> dict[str, Any]:
    """The action a turn writes for ``part``, validated.

    A stream part (a dict, or a part model) is wrapped as ``{"type": "part", "part": ...}``;
    a dict with a top-level action type (``toolPhase``, ``stop``, ``part`` with
    ``within``) or an action model is written as given. With ``max_bytes``, one whose
    text alone is larger is refused before it is validated or encoded.

    Raises:
        InvalidEvent: it is malformed, or it is a ``send``, ``retry`` or ``reset`` (a new
            turn: open one with ``store.turn``).
    """
    if isinstance(part, WireModel) and not isinstance(part, Mapping):
        data: Any = part.to_json()
    else:
        data = part
    if not isinstance(data, Mapping):
        raise InvalidEvent(
            f"a turn writes stream parts or actions (JSON objects), got {type(part).__name__}"
        )
    kind = data.get("type")
    if kind in _ACTION_TYPES:
        if kind not in _IN_TURN:
            raise InvalidEvent(
                f"a {kind!r} action starts a new turn; open one with store.turn()", field="type"
            )
        return _validated(data, max_bytes)
    return _validated({"type": "part", "part": dict(data)}, max_bytes)


def opening_action(action: Any, max_bytes: int | None = None) -> dict[str, Any]:
    """The validated action that opens a turn: a ``send`` (or a ``retry``, to continue
    after an interruption); ``max_bytes`` as for :func:`turn_action`.

    Raises:
        InvalidEvent: it is malformed or of another type.
    """
    a = _validated(action, max_bytes) if action is not None else None
    if a is None or a["type"] not in ("send", "retry"):
        raise InvalidEvent(
            "a turn opens with a send action (or a retry to continue an interrupted reply)",
            field="send_action",
        )
    return a


def is_urgent(action: Mapping[str, Any]) -> bool:
    """Whether ``action`` ends a step, so ``write`` returns only once it is durable."""
    kind = action["type"]
    if kind == "part":
        return action["part"]["type"] in _STEP_END_PARTS
    return kind in ("toolPhase", "stop")


def ends_run(action: Mapping[str, Any]) -> bool:
    """Whether a foreign event ends the run a turn is streaming (so the turn must stop)."""
    kind = action.get("type")
    if kind in ("stop", "reset", "send", "retry"):
        return True
    if kind == "part" and "within" not in action:
        part = action.get("part")
        return isinstance(part, Mapping) and part.get("type") in ("finish", "error")
    return False


def event_id(token: str, seq: int) -> str:
    """The deterministic id of a turn's ``seq``-th event (the send is 0)."""
    return f"{token}.{seq}"


_INTERRUPTION_PAYLOAD = canonical(INTERRUPTION)


def session_info(control: SessionControl | None, **fields: Any) -> SessionInfo:
    """A :class:`SessionInfo` from a session's fields and its control row."""
    if control is None:
        return SessionInfo(**fields)
    return SessionInfo(
        **fields,
        closed_at=None if control.closed_at is None else to_datetime(control.closed_at),
        closed_reason=control.closed_reason,
        interrupted=control.head_payload == _INTERRUPTION_PAYLOAD,
        writer_seen=None
        if control.writer is None or control.writer_seen is None
        else to_datetime(control.writer_seen),
    )


def writer_stale(control: SessionControl, now: int, stale_after: float) -> bool:
    """Whether no turn has written to the session for ``stale_after`` seconds.

    With a lease, its ``writer_seen`` counts; without one, the head event's time does
    (a writer that appends without a turn is alive while it appends).
    """
    seen = control.writer_seen if control.writer is not None else control.head_recorded_at
    if seen is None:
        return True
    return now - seen > stale_after * 1_000_000


@dataclass(frozen=True)
class RecoveryStatus:
    """Whether ``recover`` would interrupt a session now, and if not, why not and when.

    Attributes:
        session: the session.
        reason: ``"recoverable"`` (``recover`` would write the interruption now),
            ``"not-streaming"`` (no turn is open: nothing to recover), ``"writer-alive"``
            (a turn wrote, or renewed its lease, within ``stale_after``), or ``"closed"``
            (a closed session takes no writes; closing ended any open turn).
        status: the fold's status (``idle``, ``streaming``, ``error``).
        last_write: when a writer was last seen (its lease renewal, else the head event's
            time; ``None`` when never).
        recoverable_at: when the session becomes recoverable if nothing writes to it
            meanwhile (only for ``"writer-alive"``; else ``None``).
    """

    session: str
    reason: str
    status: str
    last_write: datetime | None = None
    recoverable_at: datetime | None = None

    @property
    def recoverable(self) -> bool:
        """``True`` when ``recover`` would interrupt the session now."""
        return self.reason == "recoverable"

    def message(self) -> str:
        """One line for a person (the session id is not escaped: the caller shows it)."""
        if self.reason == "recoverable":
            return "its writer is gone: recover interrupts the open turn"
        if self.reason == "closed":
            return "it is closed (closing ended any open turn)"
        if self.reason == "not-streaming":
            return f"it is not streaming (its status is {self.status})"
        assert self.recoverable_at is not None and self.last_write is not None
        return (
            f"its writer is alive (last write {iso(self.last_write)}); it becomes recoverable at "
            f"{iso(self.recoverable_at)} if nothing writes to it before"
        )

    def to_json(self) -> dict[str, Any]:
        """``{"session", "reason", "recoverable", "status", "last_write", "recoverable_at"}``."""
        return {
            "session": self.session,
            "reason": self.reason,
            "recoverable": self.recoverable,
            "status": self.status,
            "last_write": None if self.last_write is None else iso(self.last_write),
            "recoverable_at": None if self.recoverable_at is None else iso(self.recoverable_at),
        }


def recovery_status(
    session: str, control: SessionControl, status: str, now: int, stale_after: float
) -> RecoveryStatus:
    """The decision ``recover`` makes, as a value (``control`` with its head event's time)."""
    seen = control.writer_seen if control.writer is not None else control.head_recorded_at
    last = None if seen is None else to_datetime(seen)
    if control.closed_at is not None:
        return RecoveryStatus(session, "closed", status, last)
    if status != "streaming":
        return RecoveryStatus(session, "not-streaming", status, last)
    if writer_stale(control, now, stale_after):
        return RecoveryStatus(session, "recoverable", status, last)
    assert seen is not None
    at = to_datetime(seen + int(stale_after * 1_000_000))
    return RecoveryStatus(session, "writer-alive", status, last, at)


@dataclass
class Pending:
    """One written event waiting to be durable."""

    seq: int
    action: dict[str, Any]
    type: str
    payload: bytes
    urgent: bool
    native: bytes | None = None


class TurnState:
    """One open turn's buffer and bookkeeping; every decision, no I/O.

    The writer calls :meth:`add` for each part, asks :meth:`due` when to flush, takes the
    batch with :meth:`take`, and reports the outcome with :meth:`written` or, when the
    head check failed, :meth:`reconcile` with what it then read.

    Attributes:
        session: the session id.
        token: the turn's lease token (and event-id prefix).
        row: the session row at the newest head this turn knows.
        opened: the version of the opening action.
        durable: the highest sequence number known to be durable (-1 while claiming).
        stopped: a stop (own or foreign), crash recovery or a close ended the turn.
        stop_version: the version of the event that ended it, when known.
        own_stop: the turn ended by its own ``stop``.
        wanted: a writer waits until this sequence number is durable (flush at once).
        closed: the session was closed (``closed_reason`` says why).
        dropped: written parts that were dropped because the turn stopped.
        error: a storage failure that ended the turn.
        release: the turn is ending: its last batch gives the lease up.
        finished: the lease is given up; nothing more is written.
        leased: the turn holds the session's lease. It does not while its opening action
            is buffered (:meth:`opening`: the first flush writes it and takes the lease, in
            the same group commit as every other turn's batch), nor after a batch that
            ended the run (a ``finish``, ``error`` or ``stop`` of its own gives the lease up
            with it, so leaving the turn costs no flush of its own); a later batch takes
            the lease again, only if nothing was written since.
        releasing: the batch in flight gives the lease up.
        refused: the opening claim found the session moved, leased or closed; nothing was
            written, and the opener takes the locked path instead.
        waiter: the writer's wake-up handle for this turn (opaque here).
    """

    def __init__(
        self,
        session: str,
        row: SessionRow,
        token: str,
        actor: str | None,
        max_delay: float,
        now: float,
    ) -> None:
        self.session = session
        self.row = row
        self.token = token
        self.actor = actor
        self.max_delay = max_delay
        self.opened = row.head
        self.seq = 1
        self.pending: list[Pending] = []
        self.inflight: list[Pending] = []
        self.since: float | None = None
        # When the oldest event not yet durable was written (``None``: all are durable).
        self.oldest: float | None = None
        self.last_check = now
        self.durable = 0
        self.stopped = False
        self.stop_version: int | None = None
        self.closed = False
        self.closed_reason: str | None = None
        self.dropped = 0
        self.error: Exception | None = None
        self.release = False
        self.finished = False
        self.own_stop = False
        self.wanted = 0
        self.hold_until = 0.0
        self.leased = True
        self.releasing = False
        self.refused = False
        self.waiter: Any = None

    # -- buffering ------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Events written and not yet durable."""
        return len(self.pending) + len(self.inflight)

    @property
    def last_seq(self) -> int:
        """The sequence number of the last event written."""
        return self.seq - 1

    def add(
        self,
        action: dict[str, Any],
        type_: str,
        payload: bytes,
        now: float,
        native: bytes | None = None,
    ) -> Pending:
        """Buffer a validated, encoded action (with its provider-native bytes, if any);
        its :class:`Pending` entry."""
        p = Pending(self.seq, action, type_, payload, is_urgent(action), native)
        self.seq += 1
        if not self.buffered:
            self.oldest = now
        if not self.pending:
            self.since = now
        self.pending.append(p)
        if p.urgent:
            self.wanted = p.seq
        return p

    def opening(self, action: dict[str, Any], type_: str, payload: bytes, now: float) -> Pending:
        """Buffer the turn's opening action (sequence number 0): the next flush writes it
        and takes the lease only if the head is still :attr:`row`'s and no turn holds it."""
        p = Pending(0, action, type_, payload, True)
        self.pending, self.since, self.wanted, self.leased = [p], now, 0, False
        self.oldest = now
        self.durable = -1
        return p

    def behind(self, now: float) -> bool:
        """Whether an event written more than ``max_delay`` ago is still not durable: the
        database is not taking the flushes (a lock held elsewhere, a stall, retries)."""
        return self.oldest is not None and now - self.oldest > self.max_delay

    def must_wait(self, p: Pending, release: bool, now: float) -> bool:
        """Whether ``write`` of ``p`` returns only once ``p`` is durable: it ends a step,
        or the turn gives its lease up, or the flusher is :meth:`behind`. The last keeps
        the promise that a write is durable at most ``max_delay`` after it returns: while
        the database takes no commit, writes stop being acknowledged, so a crash then can
        lose only what was written within ``max_delay`` before the stall began."""
        return p.urgent or release or self.behind(now)

    @property
    def over(self) -> bool:
        """Nothing more will be written (stopped, failed, refused, or the lease given up)."""
        return self.stopped or self.error is not None or self.finished or self.refused

    def due(self, now: float) -> bool:
        """Whether the writer should flush this turn now."""
        if self.over or self.inflight or now < self.hold_until:
            return False
        if self.pending:
            return (
                self.release
                or self.pending[0].seq <= self.wanted
                or len(self.pending) >= FLUSH_AT
                or (self.since is not None and now - self.since >= self.max_delay)
            )
        # A turn without the lease has nothing to renew, and no run a stop could end.
        return self.leased and (self.release or now - self.last_check >= self.check_every)

    def joins_flush(self, now: float) -> bool:
        """Whether this turn's buffered events should ride along in a flush made for others."""
        return bool(self.pending) and not (self.over or self.inflight or now < self.hold_until)

    @property
    def check_every(self) -> float:
        """How often an idle turn checks its session and renews its lease."""
        return min(HEARTBEAT_SECONDS, max(self.max_delay, IDLE_CHECK_SECONDS))

    def wake_at(self, now: float) -> float:
        """The latest time the writer should look at this turn again."""
        if self.over:
            return now + HEARTBEAT_SECONDS
        at = self.last_check + self.check_every
        if self.pending and self.since is not None:
            at = min(at, self.since + self.max_delay)
        return max(at, self.hold_until)

    def take(self) -> tuple[list[Pending], bool]:
        """Move the buffered events in flight (the writer then writes them); whether
        their batch gives the lease up (the turn is ending, or its last event ends the run)."""
        self.inflight, self.pending = self.pending, []
        self.since = None
        last = self.inflight[-1] if self.inflight else None
        # (Sequence number 0 is the opening send: it starts the run.)
        self.releasing = self.release or (last is not None and last.seq > 0 and ends_run(last.action))
        return self.inflight, self.releasing

    def leave(self) -> bool:
        """The turn's block is over: its last batch gives the lease up. Whether that is
        already done (the lease went with the batch that ended the run)."""
        self.release = True
        if not (self.leased or self.pending or self.inflight or self.over):
            self.finished = True
        return self.finished

    def problem(self, *, finished_ok: bool = False) -> Exception | None:
        """The error a write (or, with ``finished_ok``, a flush) must raise now, if any."""
        if self.error is not None:
            return self.error
        if self.closed:
            return SessionClosed(self.session, self.closed_reason)
        if self.stopped:
            return TurnStopped(self.session, self.stop_version, self.dropped)
        if self.finished and not finished_ok:
            return InvalidEvent("the turn has ended; open a new one with store.turn()")
        return None

    # -- outcomes -------------------------------------------------------------------------

    def written(self, row: SessionRow, now: float, released: bool) -> None:
        """The in-flight batch was committed; ``row`` is the session's new head row."""
        if self.durable < 0:
            self.opened = row.head
        self.leased = not released
        if self.inflight:
            self.durable = self.inflight[-1].seq
            if self.inflight[-1].type == "stop":
                self.stopped, self.stop_version, self.own_stop = True, row.head, True
        self.inflight = []
        self.oldest = self.since if self.pending else None
        self.row = row
        self.last_check = now
        if released and self.release:
            self.finished = True

    def failed(self, exc: Exception) -> None:
        """The database failed for good: the turn ends with ``exc``."""
        self.error = exc
        self.pending = self.inflight + self.pending
        self.inflight = []

    def retry_later(self, now: float, delay: float) -> None:
        """A retryable failure: the in-flight events go back in front (same ids, so the
        retry's head check finds them if the failed attempt did commit) after ``delay``."""
        self.pending = self.inflight + self.pending
        self.inflight = []
        if self.since is None:
            self.since = now
        self.hold_until = now + delay

    def reconcile(self, control: SessionControl, after: Sequence[EventRow], now: float) -> None:
        """The head check failed: decide from the session's control row and the events
        recorded after the head this turn knew.

        Events carrying the in-flight ids in order are this turn's own (a retried flush
        whose first attempt did commit): they count as durable. Then a close, a lost lease
        or a foreign event that ends the run (stop, reset, send, retry, top-level finish or
        error) stops the turn and drops what is buffered; any other foreign event (a tool
        runner's ``toolPhase``) is built on: the buffered events are written after it.
        """
        # The last event of each batch carries the turn's id for its sequence number; the
        # newest one found marks how many in-flight events an unacknowledged attempt wrote.
        seqs = {event_id(self.token, p.seq): i + 1 for i, p in enumerate(self.inflight)}
        mine = max((seqs.get(e.event_id or "", 0) for e in after[: len(self.inflight)]), default=0)
        if mine:
            e = after[mine - 1]
            if self.durable < 0:
                self.opened = e.version
            self.durable = self.inflight[mine - 1].seq
            self.row = head_after(self.row, e.version, e.hash, e.turn)
            self.leased = not self.releasing
            self.finished = self.releasing and self.release
            if self.inflight[mine - 1].type == "stop":
                self.stopped, self.stop_version, self.own_stop = True, e.version, True
        elif self.durable < 0:
            self.refused, self.inflight = True, []
            return
        left = self.inflight[mine:]
        self.inflight = []
        self.last_check = now
        foreign = list(after[mine:])
        ending = next((e for e in foreign if ends_run(orjson.loads(e.payload))), None)
        if self.stopped:
            self._drop(left)
        elif control.closed_at is not None:
            self.closed, self.closed_reason = True, control.closed_reason
            self._stop(foreign[0].version if foreign else None, left)
        elif control.writer != self.token and (self.leased or control.writer is not None):
            # The lease was taken away (or, after the run ended, taken by another turn).
            self._stop(foreign[0].version if foreign else None, left)
        elif ending is not None:
            self._stop(ending.version, left)
        else:
            if foreign:
                last = foreign[-1]
                self.row = head_after(self.row, last.version, last.hash, last.turn)
            self.pending = left + self.pending
            if self.pending and self.since is None:
                self.since = now

    def _stop(self, version: int | None, left: list[Pending]) -> None:
        self.stopped, self.stop_version = True, version
        self._drop(left)

    def _drop(self, left: list[Pending]) -> None:
        self.dropped += len(left) + len(self.pending)
        self.pending = []
