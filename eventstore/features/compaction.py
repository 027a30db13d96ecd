"""Compaction: fold an old prefix of a session into a baseline state, one session or by policy.

Every function takes an :class:`~eventstore.engine.engine.Engine`; the transactional primitive
(snapshot the baseline, move it, delete what it replaces) is
:meth:`Engine.compact_baseline <eventstore.engine.engine.Engine.compact_baseline>`. This module
adds the archive written first and the keep-the-last-N-turns policy.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from eventstore.core.appends import check_version
from eventstore.core.rows import SessionRow
from eventstore.engine.engine import Engine
from eventstore.errors import InvalidEvent
from eventstore.features.exporting import export

__all__ = ["CompactResult", "compact", "compact_all"]

JSON = dict[str, Any]


@dataclass(frozen=True)
class CompactResult:
    """What :func:`compact` did.

    Attributes:
        session: the session compacted.
        baseline: its baseline now (the state there is stored as a snapshot).
        previous_baseline: its baseline before.
        removed: events deleted.
        kept_for_branches: events at or below this version stay because a branch reads
            them (``None``: no branch needs any).
        archived: events written to the archive (0 without one).
        archive: where the archive went (a path, ``"<stream>"``, or ``None``).
    """

    session: str
    baseline: int
    previous_baseline: int
    removed: int
    kept_for_branches: int | None = None
    archived: int = 0
    archive: str | None = None

    @property
    def baseline_moved(self) -> bool:
        """``True`` when the baseline changed."""
        return self.baseline != self.previous_baseline

    def to_json(self) -> JSON:
        """The CLI's ``compact --json`` object."""
        return {
            "session": self.session,
            "baseline": self.baseline,
            "previous_baseline": self.previous_baseline,
            "removed": self.removed,
            "kept_for_branches": self.kept_for_branches,
            "archived": self.archived,
            "archive": self.archive,
        }


def compact(
    engine: Engine,
    session: Any,
    *,
    upto: Any,
    archive: str | os.PathLike[str] | IO[str] | None = None,
    actor: Any = None,
) -> CompactResult:
    """Fold events ``1..upto`` of a session into a baseline and delete them.

    The archive, when given, is written completely *before* anything is deleted: it is a
    full export of the session (see :func:`eventstore.features.exporting.export`), so ``import_``
    restores the whole history: into another database, or in place (putting the removed
    events back and lowering the baseline again, as long as the session was not compacted
    further). Then, in one transaction, the state at ``upto`` is stored as the baseline
    snapshot and the events it replaces are deleted, except those a branch still reads (at
    or below the newest fork version of any branch).

    Args:
        engine: the engine.
        session: the session to compact.
        upto: the new baseline version (``baseline <= upto <= head``).
        archive: a path (written to ``PATH.part`` and renamed when complete) or a text
            file object to write the archive to.
        actor: who compacts (kept in the compaction record).

    Returns:
        A :class:`CompactResult`.

    Raises:
        InvalidEvent: an argument is malformed.
        SessionNotFound: no such session.
        VersionNotFound: ``upto`` is beyond the head.
        CompactedError: ``upto`` is below the current baseline.
    """
    if engine.validate.version(upto, "upto") is None:
        raise InvalidEvent("upto must be an integer version, got None", field="upto")
    engine.validate.optional_id(actor, "actor")
    check_version(engine.session_row(session), upto)
    archived, where = 0, None
    if archive is not None:
        archived = export(engine, session, archive)
        where = "<stream>" if hasattr(archive, "write") else str(os.fspath(archive))
    rec = engine.compact_baseline(session, upto, actor=actor)
    return CompactResult(
        session=session,
        baseline=rec.baseline,
        previous_baseline=rec.previous_baseline,
        removed=rec.deleted,
        kept_for_branches=rec.kept_for_branches,
        archived=archived,
        archive=where,
    )


def _turn_start(engine: Engine, row: SessionRow, turn: int) -> int:
    """The version of the first event of ``turn`` (scanning back from the head)."""
    first = row.head + 1
    for e in engine.history(row.id, after=row.baseline, upto=row.head, desc=True):
        if e.turn < turn:
            break
        first = e.version
    return first


def compact_all(
    engine: Engine,
    *,
    keep_last_turns: Any,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[CompactResult]:
    """Compact every session, keeping its last ``keep_last_turns`` turns loadable.

    For each session, the baseline moves to the version just before the first event of
    the oldest kept turn (with ``keep_last_turns=0``: to the head). Sessions whose
    baseline would not move are left alone (their result has ``removed == 0``).

    Args:
        engine: the engine.
        keep_last_turns: how many of the newest turns stay loadable event by event.
        progress: called as ``progress(done, total, session)`` after each session.

    Returns:
        One :class:`CompactResult` per session, oldest session first.

    Raises:
        InvalidEvent: ``keep_last_turns`` is not an integer >= 0, or ``progress`` is not callable.
    """
    if engine.validate.count(keep_last_turns, "keep_last_turns") is None:
        raise InvalidEvent("keep_last_turns must be an integer >= 0, got None", field="keep_last_turns")
    engine.validate.progress(progress)
    ids = [r.id for r in engine.session_rows()]
    results: list[CompactResult] = []
    for i, sid in enumerate(ids, 1):
        row = engine.session_row(sid)
        if keep_last_turns == 0:
            upto = row.head
        else:
            oldest_kept = row.head_turn - keep_last_turns + 1
            upto = row.baseline if oldest_kept <= 0 else _turn_start(engine, row, oldest_kept) - 1
        if upto > row.baseline:
            results.append(compact(engine, sid, upto=upto))
        else:
            results.append(CompactResult(sid, row.baseline, row.baseline, 0))
        if progress is not None:
            progress(i, len(ids), sid)
    return results
