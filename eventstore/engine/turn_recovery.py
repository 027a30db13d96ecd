"""Crash recovery of a streaming turn whose writer died, and closing a session to writes.

Both end a turn from outside it: :func:`recover` only when no writer has shown life for
``stale_after`` seconds (a live writer is never interrupted), :func:`close_session` at
once. :func:`recovery_status_of` says which :func:`recover` would do now, and why.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from eventstore.core.appends import head_after
from eventstore.core.codec import encode_action
from eventstore.core.records import Recovery
from eventstore.core.reducer import fold_json, resumable
from eventstore.core.rows import SessionControl, SessionRow
from eventstore.core.validation import MAX_SECONDS
from eventstore.core.turn_rules import INTERRUPTION, RecoveryStatus, recovery_status, writer_stale
from eventstore.engine.engine import Engine
from eventstore.engine.transaction_steps import now_micros
from eventstore.errors import InvalidEvent, SessionNotFound

__all__ = ["check_stale_after", "recover", "recovery_status_of", "close_session"]


def check_stale_after(value: Any) -> float:
    """``stale_after`` as a float: a positive number of seconds, at most ``MAX_SECONDS``.

    Raises:
        InvalidEvent: it is not.
    """
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise InvalidEvent(
            f"stale_after must be a positive number of seconds up to {MAX_SECONDS:.0e}, got {value!r}",
            field="stale_after",
        )
    return float(value)


def recover(engine: Engine, session: Any, *, stale_after: Any = 30.0) -> Recovery | None:
    """Close a turn whose writer died; the continuation seed, or ``None``.

    When the session's status is ``streaming`` and no turn in any process has written to
    it (or renewed its lease) for ``stale_after`` seconds, append the interruption part
    (an ``error`` part: every open call is cancelled), give the dead writer's lease up and
    return :class:`Recovery` with ``resumable`` of the messages. Otherwise write nothing
    and return ``None``: a live writer is never interrupted.

    Raises:
        InvalidEvent: an argument is malformed.
        SessionNotFound: no such session.
        SessionClosed: the session is closed.
    """
    eng = engine
    eng.validate.id(session, "session")
    stale = check_stale_after(stale_after)
    st = eng.storage
    action = dict(INTERRUPTION)
    encoded = encode_action(action)
    now = now_micros()
    with st.write(session=session) as tx:
        row = st.session(tx, id=session, lock=True)
        if row is None:
            raise SessionNotFound(session)
        eng.check_open(tx, row)
        control = _last_writes(eng, tx, row)
        if not writer_stale(control, now, stale):
            return None
        state = eng.state_at(tx, row, row.head)
        if state.get("status") != "streaming":
            if control.writer is not None:
                st.update_session(tx, row.pk, writer=(None, None))  # a dead writer's lease, nothing open
            return None
        rows, prev, turn, plan = eng.write_locked(
            tx, row, [action], [encoded], None, "recovery", None, now
        )
        st.update_session(tx, row.pk, writer=(None, None))
    eng.planner.committed(head_after(row, rows[-1].version, prev, turn), plan)
    after = fold_json(state, [action])
    return Recovery(rows[-1].version, resumable(after["messages"]))


def _last_writes(engine: Engine, tx: Any, row: SessionRow) -> SessionControl:
    """The session's control row with its head event's time (what staleness is judged by)."""
    control = engine.storage.controls(tx, row.pk, with_head_event=True)[row.pk]
    if control.head_recorded_at is None:
        # A branch still at its fork point: its creation is the last write to it.
        control = replace(control, head_recorded_at=row.created_at)
    return control


def recovery_status_of(engine: Engine, session: Any, *, stale_after: Any = 30.0) -> RecoveryStatus:
    """Whether :func:`recover` would interrupt the session now; if not, why not and when it
    would (it writes nothing).

    Raises:
        InvalidEvent: an argument is malformed.
        SessionNotFound: no such session.
        SessionErased: it was erased.
    """
    engine.validate.id(session, "session")
    stale = check_stale_after(stale_after)
    st = engine.storage
    with st.read() as tx:
        row = st.session(tx, id=session)
        if row is None:
            raise engine.missing(tx, session)
        control = _last_writes(engine, tx, row)
        status = str(engine.state_at(tx, row, row.head).get("status"))
    return recovery_status(session, control, status, now_micros(), stale)


def close_session(engine: Engine, session: Any, *, reason: Any = None) -> None:
    """Close a session to writes (idempotent; a later close keeps the first reason).

    A session left ``streaming`` (a live turn, or a writer that died) is ended in the same
    transaction: the interruption ``error`` part is appended (actor ``"close"``; every open
    call is cancelled) and the writer's lease is given up, so a closed session is never
    stuck mid-turn. A live turn's parts not yet flushed are dropped, and its next
    ``write`` or ``flush`` raises :class:`~eventstore.errors.SessionClosed`.

    Raises:
        InvalidEvent: an argument is malformed.
        SessionNotFound: no such session.
    """
    engine.validate.id(session, "session")
    engine.validate.optional_id(reason, "reason")
    st = engine.storage
    action = dict(INTERRUPTION)
    encoded = encode_action(action)
    committed = None
    with st.write(session=session) as tx:
        row = st.session(tx, id=session, lock=True)
        if row is None:
            raise SessionNotFound(session)
        if st.controls(tx, row.pk)[row.pk].closed_at is None:
            now = now_micros()
            # A turn still open would stay `streaming` for good: nothing can write to a
            # closed session, recovery included. So the close ends it, as a recovery does,
            # under the session's lock: the live writer's next flush finds the session
            # closed and its buffered parts are dropped (``turn.dropped``).
            if engine.state_at(tx, row, row.head).get("status") == "streaming":
                rows, prev, turn, plan = engine.write_locked(
                    tx, row, [action], [encoded], None, "close", None, now
                )
                committed = (head_after(row, rows[-1].version, prev, turn), plan)
            st.update_session(tx, row.pk, writer=(None, None), closed=(now, reason))
    if committed is not None:
        engine.planner.committed(*committed)
