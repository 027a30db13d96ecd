"""Signed checkpoints of a database, and erasure: the audit features that take an engine.

:func:`checkpoint` signs every session's head (see :mod:`eventstore.core.checkpoints` for the
format and for what verifying against one decides; :func:`eventstore.features.integrity.verify` does
the verifying). :func:`erase` removes a session and every branch forked from it, leaving
tombstones; :func:`erase_older_than` does so by age, for retention.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from eventstore.core.checkpoints import Checkpoint, SessionHead, sign_checkpoint
from eventstore.core.rewinds import Rewinds
from eventstore.core.codec import state_digest
from eventstore.core.rows import RewindRow, SessionRow
from eventstore.core.validation import check_text
from eventstore.engine.engine import Engine, Tx
from eventstore.engine.transaction_steps import now_micros
from eventstore.errors import InvalidEvent

__all__ = ["MAX_REASON", "baseline_digest", "checkpoint", "erase", "erase_older_than", "parse_age"]

#: The longest erasure reason accepted, in characters.
MAX_REASON = 4096
#: Reasons may span lines: tabs and newlines pass.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_AGE = re.compile(r"\A([0-9]{1,9})([smhdw])\Z")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def checkpoint(engine: Engine, private_key: Any, *, origin: Any = None) -> Checkpoint:
    """Sign a statement of every session's head version, head hash and baseline.

    The heads are read in one read transaction, so the checkpoint is one consistent
    moment of the database.

    Args:
        engine: the engine.
        private_key: the Ed25519 private key (PEM bytes, as :func:`generate_keypair` returns).
        origin: names the database in the checkpoint; default: its masked URL.

    Raises:
        CheckpointError: the key is unusable, or ``origin`` carries a password or control
            characters.
    """
    with engine.storage.read() as tx:
        rows = engine.storage.sessions(tx)
        # The baseline state is anchored too: its snapshot and its compaction record can be
        # rewritten together by the database owner, and nothing else would notice.
        heads = [
            SessionHead(
                id=r.id,
                head=r.head,
                head_hash=r.head_hash,
                baseline=r.baseline,
                baseline_hash=r.baseline_hash if r.baseline else None,
                baseline_digest=baseline_digest(engine, tx, r),
            )
            for r in rows
        ]
    return sign_checkpoint(
        heads,
        private_key,
        origin=engine.storage.safe_url if origin is None else origin,
        created_at=datetime.now(timezone.utc),
    )


def baseline_digest(engine: Engine, tx: Tx, row: SessionRow) -> bytes | None:
    """The digest of the state the database serves at a session's baseline (``None``: never
    compacted)."""
    return state_digest(engine.state_at(tx, row, row.baseline)) if row.baseline else None


def check_reason(value: Any) -> str:
    """``value`` once it is a reason a record can keep (non-empty, bounded, printable).

    Raises:
        InvalidEvent: it is not.
    """
    if not isinstance(value, str) or not value.strip():
        raise InvalidEvent(f"reason must be a non-empty string, got {value!r}", field="reason")
    if len(value) > MAX_REASON:
        raise InvalidEvent(f"reason is longer than {MAX_REASON} characters", field="reason")
    check_text(value, "reason", _CONTROL)
    return value


def erase(engine: Engine, session: Any, *, reason: Any, actor: Any = None) -> list[str]:
    """Erase a session and every branch forked from it, leaving a tombstone for each.

    One transaction deletes their events, snapshots, compaction records and session rows,
    writes the tombstones (head, head hash, when, ``actor``, ``reason``) and deletes the
    snapshot blobs no remaining snapshot uses. Afterwards ``load``/``history`` of any of
    them raise :class:`~eventstore.errors.SessionErased` and the ids cannot be used again.

    A session that was rewound shares its events with the lines the rewinds kept
    (``session~1``, ...): they are erased with it, as its branches are (and erasing a
    kept line erases the session too, which branches from it).

    Returns:
        The erased session ids: ``session`` first (for a rewound session, its first kept
        line), then its branches (parents first).

    Raises:
        InvalidEvent: an argument is malformed (``reason`` is required).
        SessionNotFound: no such session.
        SessionErased: it was erased already.
        StorageError: the role may not erase (the application role cannot).
    """
    engine.validate.id(session, "session")
    why = check_reason(reason)
    engine.validate.optional_id(actor, "actor")
    return _erase(engine, session, why, actor, None)


def _erase(engine: Engine, session: str, why: str, actor: str | None, cutoff: int | None) -> list[str]:
    """Erase in one transaction; with ``cutoff``, only if the session and its branches
    still had no event since (checked under their locks: an append that came in after the
    retention scan keeps the session) — ``[]`` when not erased."""
    st = engine.storage
    with st.write() as tx:
        row = st.session(tx, id=session, lock=True)
        if row is None:
            if cutoff is not None:
                return []
            raise engine.missing(tx, session)
        # A session made by a rewind shares its events with the line the rewind kept: the
        # erasure starts from the first such line (its branches include the session).
        while (made := Rewinds(st.records(tx, RewindRow, pks=(row.pk,))).by_new.get(row.pk)) is not None:
            kept = engine.session_by_pk(tx, made.kept_pk)
            row = st.session(tx, id=kept.id, lock=True) or kept
        if cutoff is not None:
            family = [row, *(st.session(tx, id=r.id, lock=True) or r for r in st.sessions(tx, descendants_of=row.pk))]
            if any(_last_activity(engine, tx, r) >= cutoff for r in family):
                return []
        done = st.erase_session(tx, row.pk, erased_at=now_micros(), actor=actor, reason=why)
    # The cached heads and states of the erased sessions must not be reused.
    engine.planner.clear()
    return [t.session_id for t in done.tombstones]


def parse_age(text: Any) -> timedelta:
    """``"90d"`` → 90 days (units ``s``, ``m``, ``h``, ``d``, ``w``).

    Raises:
        InvalidEvent: not a positive whole number followed by one unit.
    """
    m = _AGE.match(text) if isinstance(text, str) else None
    if m is None or int(m.group(1)) == 0:
        raise InvalidEvent(
            f"an age is a positive number and a unit (s, m, h, d, w), like 90d; got {text!r}",
            field="older_than",
        )
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def _last_activity(engine: Engine, tx: Tx, row: SessionRow) -> int:
    """When the session last changed: its head event's time (its creation without one)."""
    e = engine.event_at(tx, row.pk, row.head) if row.head > (row.fork_version or 0) else None
    return max(row.created_at, e.recorded_at if e is not None else 0)


def erase_older_than(
    engine: Engine, older_than: Any, *, reason: Any, actor: Any = None, dry_run: Any = False
) -> list[str]:
    """Erase every session whose last event is older than ``older_than`` (retention).

    A session goes with its branches, so it is erased only when it and every branch forked
    from it are that old; a branch that is old while its parent is not is erased on its
    own. The age is checked again under the sessions' locks, so one that received an event
    since the scan is kept.

    Args:
        engine: the engine.
        older_than: a :class:`~datetime.timedelta` or an age like ``"90d"`` (see :func:`parse_age`).
        reason: why (recorded in every tombstone).
        actor: who.
        dry_run: only list what would be erased.

    Returns:
        The ids erased (or, with ``dry_run``, that would be), each erasure's session first.

    Raises:
        InvalidEvent: an argument is malformed.
        StorageError: the role may not erase.
    """
    age = older_than if isinstance(older_than, timedelta) else parse_age(older_than)
    if age <= timedelta(0):
        raise InvalidEvent("older_than must be positive", field="older_than")
    why = check_reason(reason)
    engine.validate.optional_id(actor, "actor")
    engine.validate.flag(dry_run, "dry_run")
    cutoff = now_micros() - age // timedelta(microseconds=1)
    with engine.storage.read() as tx:
        rows = engine.storage.sessions(tx)
        old = {r.pk for r in rows if _last_activity(engine, tx, r) < cutoff}
    children: dict[int, list[int]] = {}
    for r in rows:
        if r.parent_pk is not None:
            children.setdefault(r.parent_pk, []).append(r.pk)

    def all_old(pk: int) -> bool:
        return pk in old and all(all_old(c) for c in children.get(pk, ()))

    eligible = {r.pk for r in rows if all_old(r.pk)}
    # Only the topmost of each erasable family: erasing it takes the rest along.
    tops = [r for r in rows if r.pk in eligible and r.parent_pk not in eligible]
    if dry_run:
        ids = {r.pk: r.id for r in rows}
        out: list[str] = []

        def family(pk: int) -> None:
            out.append(ids[pk])
            for c in children.get(pk, ()):
                family(c)

        for r in tops:
            family(r.pk)
        return out
    erased: list[str] = []
    for r in tops:
        erased += _erase(engine, r.id, why, actor, cutoff)
    return erased
