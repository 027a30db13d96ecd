"""Rewind a session to an earlier version, keeping the line it leaves under its own id.

What an edit, a regenerate or an undo in a chat app does to the log: the session's id
names a line that ends at the chosen version; the events after it are not changed,
copied or deleted, they stay readable under the kept id ``"{session}~{n}"``. The rules
that name sessions and events around a rewind are in :mod:`eventstore.core.rewinds`.
"""

from __future__ import annotations

from typing import Any

from eventstore.core.appends import check_version
from eventstore.core.records import SessionInfo
from eventstore.core.rewinds import Rewinds, kept_id, kept_reason
from eventstore.core.rows import RewindRow
from eventstore.engine.engine import Engine
from eventstore.engine.transaction_steps import now_micros
from eventstore.errors import ConcurrencyError, InvalidEvent, TurnBusy
from eventstore.features.audit import check_reason

__all__ = ["rewind", "lines"]


def rewind(
    engine: Engine,
    session: Any,
    *,
    to: Any,
    expected_version: Any = None,
    actor: Any = None,
    reason: Any = None,
) -> str | None:
    """Make version ``to`` the head of ``session`` (see :meth:`eventstore.EventStore.rewind`).

    One transaction under the session's lock: the session's row is renamed to the kept
    id and closed to writes, a row for the session id is inserted as a branch of it at
    ``to``, and the audit record is written. O(1) in the number of events.

    Returns:
        The kept id, or ``None`` when ``to`` is the head (nothing is written).

    Raises:
        InvalidEvent: an argument is malformed.
        SessionNotFound, SessionErased: no such session.
        VersionNotFound, CompactedError: ``to`` is above the head or below the baseline.
        ConcurrencyError: ``expected_version`` is not the head.
        SessionClosed: the session is closed to writes.
        TurnBusy: a streaming turn holds the session.
    """
    v = engine.validate
    v.id(session, "session")
    if v.version(to, "to") is None:
        raise InvalidEvent("to must be an integer version, got None", field="to")
    v.count(expected_version, "expected_version")
    v.optional_id(actor, "actor")
    why = None if reason is None else check_reason(reason)
    with engine.writing() as tx:
        row = engine.find_row(tx, session, lock=True)
        if row is None:
            raise engine.missing(tx, session)
        if expected_version is not None and row.head != expected_version:
            raise ConcurrencyError(session, expected_version, row.head)
        control = engine.check_open(tx, row)
        if control.writer is not None:
            now = now_micros()
            raise TurnBusy(session, max(0, now - (control.writer_seen or now)) / 1e6)
        target = check_version(row, to)
        if target == row.head:
            return None
        taken = [r.kept_id for r in engine.rewinds(tx, session_id=session)]
        kid = kept_id(session, taken)
        # An id of that shape made before such ids were refused, or erased: skip past it.
        while engine.find_row(tx, kid) is not None or engine.tombstone(tx, kid) is not None:
            taken.append(kid)
            kid = kept_id(session, taken)
        now = now_micros()
        rec = RewindRow(
            session_id=session,
            kept_id=kid,
            kept_pk=row.pk,
            new_pk=0,
            from_head=row.head,
            from_hash=row.head_hash,
            to_version=target,
            rewound_at=now,
            actor=actor,
            reason=why,
        )
        # The same conversation: the new row keeps the session's creation time.
        new = engine.fork_of(tx, row, target, session, row.created_at)
        made = engine.record_rewind(tx, rec, closed_at=now, reason=kept_reason(session, target), new=new)
        assert made is not None  # a rewind (not a write-back) returns the new row
        engine.carry_catalogue(tx, row.pk, made.pk, now)
    # This process's cached head of the id is the kept line's now.
    engine.planner.take_head(session)
    return kid


def lines(engine: Engine, session: Any) -> list[SessionInfo]:
    """The lines rewound away from ``session``, oldest first (see :meth:`eventstore.EventStore.lines`).

    Raises:
        InvalidEvent: the id is malformed.
        SessionNotFound, SessionErased: no such session.
    """
    with engine.reading() as tx:
        engine.row(tx, session)
        recs = engine.rewinds(tx, session_id=session)
        rows = [
            row
            for rec in recs
            if (row := engine.find_row(tx, rec.kept_id)) is not None and row.pk == rec.kept_pk
        ]
        controls = {row.pk: engine.control(tx, row.pk, with_head_event=True) for row in rows}
        return engine.infos(tx, rows, {row.pk: row for row in rows}, controls, Rewinds(recs))
