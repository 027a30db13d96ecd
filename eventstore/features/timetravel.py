"""Time travel over the engine: diff two refs, replay the fold, and the turn view.

Every function takes an :class:`~eventstore.engine.engine.Engine` as its first argument;
:class:`~eventstore.EventStore` exposes them as thin methods (``store.diff``,
``store.replay``, ``store.turns``). Version ranges use the store's one vocabulary:
``after`` (exclusive) and ``upto`` (inclusive).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from eventstore.core.appends import check_version, lineage_segments
from eventstore.core.diff import Ref, SessionDiff, diff_states, find_base
from eventstore.core.records import RecordedEvent
from eventstore.core.reducer import fold_json
from eventstore.core.turn_view import Turn, build_turns
from eventstore.engine.engine import Engine
from eventstore.errors import VersionNotFound

__all__ = ["ReplayStep", "diff", "replay", "turns"]

JSON = dict[str, Any]


# -- diff -------------------------------------------------------------------------------


def diff(engine: Engine, a: Any, b: Any, *, events: Any = False) -> SessionDiff:
    """Compare two refs: the newest shared state and the message-level changes.

    The cost is the lineage walk (session rows), two checkouts (a snapshot plus at most
    ``snapshot_every`` events each) and the message comparison; with ``events=True``, also
    reading the events on each side since the base.

    Args:
        engine: the engine.
        a: the left ref ``(session, version)``; version ``None`` means the head.
        b: the right ref.
        events: also return the events on each side since the base
            (``left_events`` / ``right_events``).

    Returns:
        A :class:`~eventstore.core.diff.SessionDiff` from ``a`` to ``b``.

    Raises:
        InvalidEvent: a ref is not a ``(session, version | None)`` pair.
        SessionNotFound: a session does not exist.
        VersionNotFound: a version is outside ``0..head``.
        CompactedError: a version lies below its session's compaction baseline.
    """
    a = engine.validate.ref(a, "a")
    b = engine.validate.ref(b, "b")
    engine.validate.flag(events, "events")
    with engine.reading() as tx:
        ra, rb = engine.row(tx, a[0]), engine.row(tx, b[0])
        va, vb = check_version(ra, a[1]), check_version(rb, b[1])
        base = find_base(
            lineage_segments(engine.lineage(tx, ra), va),
            lineage_segments(engine.lineage(tx, rb), vb),
        )
    left = engine.load(a[0], va)
    right = engine.load(b[0], vb)
    sd = diff_states(left, right)
    since = base.version if base is not None else 0
    left_events = right_events = None
    if events:
        left_events = tuple(engine.history(a[0], after=since, upto=va))
        right_events = tuple(engine.history(b[0], after=since, upto=vb))
    return SessionDiff(
        left=Ref(a[0], va),
        right=Ref(b[0], vb),
        base=base,
        added=sd.added,
        removed=sd.removed,
        changed=sd.changed,
        status_left=str(left.get("status")),
        status_right=str(right.get("status")),
        events_left=va - since,
        events_right=vb - since,
        details=sd.details,
        left_messages=sd.left_messages,
        right_messages=sd.right_messages,
        error_left=left.get("error"),
        error_right=right.get("error"),
        left_events=left_events,
        right_events=right_events,
    )


# -- replay -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayStep:
    """One event of a replay with the states around it.

    Attributes:
        event: the recorded event.
        before: the state before it (JSON-shaped; shared structure, treat as immutable).
        after: the state after it.
    """

    event: RecordedEvent
    before: JSON = field(repr=False)
    after: JSON = field(repr=False)

    @property
    def changes(self) -> list[str]:
        """Readable lines saying what the event changed (empty when nothing did)."""
        if self.before is self.after:
            return []
        sd = diff_states(self.before, self.after)
        lines = [f"+ {sd.right_messages[k].get('role')} {k}" for k in sd.added]
        lines += [f"- {sd.left_messages[k].get('role')} {k}" for k in sd.removed]
        for d in sd.details:
            lines += [f"{d.id}: {line}" for line in d.lines]
        if self.before.get("status") != self.after.get("status"):
            lines.append(f"status {self.before.get('status')} → {self.after.get('status')}")
        if self.before.get("error") != self.after.get("error"):
            err = self.after.get("error")
            lines.append(f"error → {err.get('message')!r}" if err else "error cleared")
        return lines

    def to_json(self) -> JSON:
        """The event and what it changed, as whole values: the messages it added or
        changed (as they are after it), the ids it removed, the status and error after it.
        """
        e = self.event
        sd = diff_states(self.before, self.after)
        return {
            "session": e.session_id,
            "version": e.version,
            "type": e.type,
            "action": e.action,
            "turn": e.turn,
            "messages": {
                "added": [sd.right_messages[k] for k in sd.added],
                "removed": list(sd.removed),
                "changed": [sd.right_messages[k] for k in sd.changed],
            },
            "status": self.after.get("status"),
            "error": self.after.get("error"),
        }


def replay(
    engine: Engine,
    session: Any,
    *,
    after: Any = None,
    upto: Any = None,
) -> Iterator[ReplayStep]:
    """Step through the fold of a session, event by event, lazily.

    Args:
        engine: the engine.
        session: the session (a branch replays its inherited prefix too).
        after: replay from the state at this version (default: the baseline, 0 when the
            session was never compacted); the first step is event ``after + 1``.
        upto: the last version to replay (default: the head).

    Returns:
        An iterator of :class:`ReplayStep`; the session and bounds are checked before
        it is returned, the events are read as it is consumed.

    Raises:
        InvalidEvent: an argument is malformed.
        SessionNotFound, VersionNotFound, CompactedError: as for ``load``.
    """
    engine.validate.version(after, "after")
    engine.validate.version(upto, "upto")
    row = engine.session_row(session)
    first = check_version(row, row.baseline if after is None else after)
    last = check_version(row, upto)
    if first > last:
        raise VersionNotFound(session, first, row.head, f"replay start {first} is after its end {last}")
    state = engine.load(session, first)

    def steps() -> Iterator[ReplayStep]:
        before = state
        for e in engine.history(session, after=first, upto=last):
            state_after = fold_json(before, [e.action])
            yield ReplayStep(e, before, state_after)
            before = state_after

    return steps()


# -- turns ------------------------------------------------------------------------------


def turns(engine: Engine, session: Any, *, upto: Any = None) -> list[Turn]:
    """The turn view of a session: one :class:`~eventstore.core.turn_view.Turn` per turn.

    Args:
        engine: the engine.
        session: the session.
        upto: stop at this version (default: the head).

    Returns:
        The turns oldest first; for a compacted session the first one may be partial.

    Raises:
        InvalidEvent: an argument is malformed.
        SessionNotFound, VersionNotFound, CompactedError: as for ``load``.
    """
    engine.validate.version(upto, "upto")
    row = engine.session_row(session)
    last = check_version(row, upto)
    start_state = engine.load(session, row.baseline) if row.baseline else None
    return build_turns(engine.history(session, after=row.baseline, upto=last), start_state)
