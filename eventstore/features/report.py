"""The audit report: a session (or the difference between two refs) gathered for one HTML page.

Built from the engine's reads (``load``, ``sessions``, ``history``), the verify and
time-travel modules (``verify``, ``diff``) and the pure modules: the turn view
(:mod:`eventstore.core.turn_view`) groups the events into turns and the reducer folds
them. The page itself is :mod:`eventstore.features.report_html`'s: it stands alone (inline
CSS, one inline script allowed by its hash, nothing loaded from anywhere), so it can travel
as an e-mail attachment or a ticket file.
"""

from __future__ import annotations

from typing import Any

from eventstore.core.checkpoints import Checkpoint
from eventstore.core.diff import SessionDiff
from eventstore.core.reducer import fold_json
from eventstore.core.turn_view import build_turns
from eventstore.engine.engine import Engine
from eventstore.features import timetravel
from eventstore.features import integrity
from eventstore.features.files import text_out
from eventstore.features.report_html import SessionReport, diff_html, page, session_page

__all__ = ["render_report", "render_diff_report", "report"]


JSON = dict[str, Any]


def render_report(
    engine: Engine,
    session: str,
    version: int | None = None,
    *,
    checkpoint: Checkpoint | None = None,
    public_key: bytes | None = None,
) -> str:
    """The audit report of a session as one self-contained HTML page.

    Args:
        engine: the engine of the store to read.
        session: the session id.
        version: render the session as it was after this event; ``None`` for its head.
        checkpoint: a signed checkpoint the verify result must also prove the database
            extends (with ``public_key``, the key it must be signed with).

    Returns:
        The page, as text (UTF-8 when written out).

    Raises:
        SessionNotFound: no such session.
        VersionNotFound: ``version`` is negative, not a number or beyond the head.
        CompactedError: ``version`` lies below the session's compaction baseline.
    """
    engine.load(session, version)  # validates the session and the version first
    infos = engine.sessions()
    info = next(s for s in infos if s.id == session)
    upto = info.head if version is None else version
    start = engine.load(session, info.baseline) if info.baseline else None
    events = list(engine.history(session, after=info.baseline, upto=upto))
    states: list[JSON] = []

    def fold(state: JSON | None, actions: list[JSON]) -> JSON:
        new = fold_json(state, actions)
        states.append(new)
        return new

    turns = build_turns(events, start, fold=fold)
    checked = integrity.verify(engine, session, checkpoint=checkpoint, public_key=public_key)
    return session_page(
        SessionReport(
            session, version, upto, info, infos, start, events, turns, states, checked, checkpoint
        )
    )


def render_diff_report(
    engine: Engine, left: tuple[str, int | None], right: tuple[str, int | None]
) -> str:
    """The difference between two refs as one self-contained HTML page.

    Shows the shared fork point, the messages only on each side (in full), what changed
    inside messages on both sides, each side's status, and the events each side recorded
    since the fork point.

    Args:
        engine: the engine of the store to read.
        left: ``(session, version | None)``, ``None`` meaning the head.
        right: the same for the other side.

    Returns:
        The page, as text.

    Raises:
        SessionNotFound, VersionNotFound, CompactedError: as for ``EventStore.diff``.
    """
    d: SessionDiff = timetravel.diff(engine, left, right, events=True)
    return page(f"eventstore diff: {d.left} → {d.right}", diff_html(d))


def report(
    engine: Engine,
    session: Any,
    version: Any = None,
    *,
    against: tuple[str, int | None] | None = None,
    out: Any = None,
    checkpoint: Checkpoint | None = None,
    public_key: bytes | None = None,
) -> str:
    """The page :meth:`eventstore.EventStore.report` returns: the session's report, or
    with ``against`` the diff from ``(session, version)`` to that ref; also written to
    ``out`` (a path, written to ``PATH.part`` and renamed when complete, or a text file
    object) when given. With ``checkpoint`` and ``public_key``, the session's verify result
    also proves the database still extends that signed checkpoint."""
    if against is not None:
        page = render_diff_report(engine, (session, version), against)
    else:
        page = render_report(engine, session, version, checkpoint=checkpoint, public_key=public_key)
    if out is not None:
        with text_out(out) as fh:
            fh.write(page)
    return page
