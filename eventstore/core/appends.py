"""The engine's pure half: rows in, rows and plans out. No storage, no clock, no I/O.

Everything here works on the plain rows storage returns (:class:`SessionRow`,
:class:`EventRow`, :class:`SnapshotRow`, :class:`LoadParts`) and on state dicts, so the
synchronous engine (:mod:`eventstore.engine.engine`) and an asyncio twin over async storage run
the very same validation results, hashing, snapshot planning and folding; they differ only
in how they fetch and write rows.

- Lineage: :func:`segments`, :func:`baselines`, :func:`history_segments`,
  :func:`lineage_segments` (where each version of a branch lives).
- Versions: :func:`check_version`, :func:`known_hash_turn`.
- Appends: :func:`event_rows` (versions, turns, chained hashes), :func:`replayed`
  (an idempotent retry), :func:`snapshot_boundaries` (which snapshots an append reaches;
  the engine's :class:`~eventstore.engine.planner.AppendPlanner` caches around it).
- Loads: :func:`state_from_parts`, :func:`fold_tail`.
- Records: :func:`recorded`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from eventstore.core.chain import next_turn
from eventstore.core.codec import SnapshotCodec, chain_hash, decode_metadata, decode_payload
from eventstore.core.diff import LineageSegment
from eventstore.core.feed_rules import position as feed_position
from eventstore.core.records import AppendResult, RecordedEvent, to_datetime
from eventstore.core.reducer import fold_json
from eventstore.core.rows import (
    ZERO_HASH,
    EventRow,
    FeedRow,
    LoadParts,
    Segment,
    SessionRow,
)
from eventstore.errors import (
    CompactedError,
    EventIdConflict,
    InvalidEvent,
    StorageError,
    VersionNotFound,
)

__all__ = [
    "State",
    "segments",
    "baselines",
    "history_segments",
    "lineage_segments",
    "check_version",
    "known_hash_turn",
    "event_rows",
    "replayed",
    "snapshot_boundaries",
    "state_from_parts",
    "fold_tail",
    "check_tail",
    "recorded",
    "recorded_from_feed",
    "head_after",
    "missing_blob",
]

#: A state dict in the wire shape (``SessionState.to_json()``); ``None`` is the initial state.
State = dict[str, Any]


# -- lineage ----------------------------------------------------------------------------


def segments(lineage: Sequence[SessionRow], version: int) -> list[Segment]:
    """Where versions ``1..version`` of the last session of ``lineage`` live, root first."""
    segs: list[Segment] = []
    cap = version
    for r in reversed(lineage):
        after = r.fork_version or 0
        if cap > after:
            segs.append(Segment(r.pk, after, cap))
        cap = min(cap, after)
        if cap == 0:
            break
    segs.reverse()
    return segs


def baselines(lineage: Sequence[SessionRow], version: int) -> list[tuple[int, int]]:
    """The compaction baselines ``(session_pk, baseline)`` that ``version`` may be served.

    A baseline snapshot (r, b) is r's state at b. It is this version's history too only
    when b is within what this version reads of r: a branch forked below its parent's
    later baseline must never be served it.
    """
    out: list[tuple[int, int]] = []
    cap = version
    for r in reversed(lineage):
        if 0 < r.baseline <= cap:
            out.append((r.pk, r.baseline))
        cap = min(cap, r.fork_version or 0)
    out.reverse()
    return out


def history_segments(
    lineage: Sequence[SessionRow], row: SessionRow, after: int | None, upto: int | None
) -> list[Segment]:
    """The segments a history of ``row`` reads for versions ``after < v <= upto``.

    History starts after the baseline; ``upto`` beyond the head means the head.
    """
    hi = row.head if upto is None else min(upto, row.head)
    lo = max(after or 0, row.baseline)
    return [
        Segment(s.session_pk, max(s.after, lo), s.upto) for s in segments(lineage, hi) if s.upto > lo
    ]


def lineage_segments(lineage: Sequence[SessionRow], version: int) -> list[LineageSegment]:
    """The named segments of the last session's chain up to ``version``, root first
    (what :func:`eventstore.core.diff.find_base` compares).

    The root is always present (possibly recording nothing) so that two chains from the
    same root still share its empty state.
    """
    segs: list[LineageSegment] = []
    upper = lineage[-1].head
    for cur in reversed(lineage):
        start = cur.fork_version or 0
        end = min(version, upper)
        if end > start or cur.parent_pk is None:
            segs.append(LineageSegment(cur.id, start, max(end, start)))
        upper = start
    segs.reverse()
    return segs


# -- versions ---------------------------------------------------------------------------


def check_version(row: SessionRow, version: int | None) -> int:
    """``version`` (``None``: the head) once it is known to be loadable in ``row``.

    Raises:
        VersionNotFound: it is negative or beyond the head.
        CompactedError: it lies below the session's compaction baseline.
    """
    if version is None:
        return row.head
    if type(version) is not int or version < 0 or version > row.head:
        raise VersionNotFound(row.id, version, row.head)
    if version < row.baseline:
        raise CompactedError(row.id, version, row.baseline, row.head)
    return version


def known_hash_turn(row: SessionRow, version: int) -> tuple[bytes, int] | None:
    """The chain hash and turn at ``version`` when the row itself knows them, else ``None``
    (then the event at that version has to be read)."""
    if version == 0:
        return ZERO_HASH, 0
    if version == row.head:
        return row.head_hash, row.head_turn
    if version == row.baseline and row.baseline_hash is not None:
        return row.baseline_hash, row.baseline_turn
    return None


# -- appends ----------------------------------------------------------------------------


def event_rows(
    row: SessionRow,
    session: str,
    encoded: Sequence[tuple[str, bytes]],
    ids: Sequence[str | None] | None,
    actor: str | None,
    meta: bytes | None,
    now: int,
    natives: Sequence[bytes | None] | None = None,
) -> tuple[list[EventRow], bytes, int]:
    """The batch's event rows after ``row``'s head: versions, turns, chained hashes.

    ``natives``: each action's provider-native bytes (``None`` for none), or ``None``.

    Returns:
        ``(rows, the new head hash, the new head turn)``.
    """
    prev, turn = row.head_hash, row.head_turn
    rows: list[EventRow] = []
    for i, (type_, payload) in enumerate(encoded):
        version = row.head + 1 + i
        turn = next_turn(turn, type_)
        event_id = None if ids is None else ids[i]
        native = None if natives is None else natives[i]
        prev = chain_hash(
            prev,
            session_id=session,
            version=version,
            event_id=event_id,
            type=type_,
            turn=turn,
            payload=payload,
            recorded_at=now,
            actor=actor,
            metadata=meta,
            native=native,
        )
        rows.append(
            EventRow(row.pk, version, event_id, type_, turn, payload, now, actor, meta, prev, native)
        )
    return rows, prev, turn


def head_after(row: SessionRow, head: int, head_hash: bytes, head_turn: int) -> SessionRow:
    """``row`` with its head moved (not ``dataclasses.replace``: this runs once per append
    and ``replace()`` is ~10x slower)."""
    return SessionRow(
        row.pk,
        row.id,
        row.parent_pk,
        row.fork_version,
        head,
        head_hash,
        head_turn,
        row.baseline,
        row.baseline_hash,
        row.baseline_turn,
        row.created_at,
    )


def replayed(
    session: str,
    prior: Sequence[EventRow],
    ids: Sequence[str],
    encoded: Sequence[tuple[str, bytes]],
    actor: str | None,
    meta: bytes | None,
    natives: Sequence[bytes | None] | None = None,
) -> AppendResult:
    """The result of a retried batch whose ids are already recorded (``prior``).

    The retry must carry the same content, provider-native data included.

    Raises:
        EventIdConflict: an id is recorded with other content.
        InvalidEvent: only some of the ids are recorded, or not as one batch.
    """
    by_id = {e.event_id: e for e in prior}
    for i, (event_id, (_, payload)) in enumerate(zip(ids, encoded)):
        e = by_id.get(event_id)
        native = None if natives is None else natives[i]
        if e is not None and (
            e.payload != payload or e.actor != actor or e.metadata != meta or e.native != native
        ):
            raise EventIdConflict(session, event_id, e.version)
    versions = [e.version for e in prior]
    if [e.event_id for e in prior] != list(ids) or versions != list(
        range(versions[0], versions[0] + len(ids))
    ):
        raise InvalidEvent(
            f"some of these event ids are already recorded in session {session!r} "
            f"(at versions {versions[0]}..{versions[-1]}) and some are not; "
            "send a retry with exactly the original batch",
            field="event_ids",
        )
    return AppendResult(
        session=session,
        version=versions[-1],
        first_version=versions[0],
        count=len(ids),
        event_ids=tuple(ids),
        recorded_at=to_datetime(prior[0].recorded_at),
        replayed=True,
    )


def snapshot_boundaries(start: int, end: int, every: int) -> range:
    """The snapshot versions in ``start < v <= end``: the multiples of ``every``."""
    return range((start // every + 1) * every, end + 1, every)


# -- loads ------------------------------------------------------------------------------


def fold_tail(session: str, base: int, version: int, state: State | None, actions: list[Any]) -> State:
    """Fold the events after a snapshot at ``base`` up to ``version``.

    Raises:
        StorageError: fewer events than ``version - base`` were found.
    """
    check_tail(session, base, version, len(actions))
    return fold_json(state, actions)


def check_tail(session: str, base: int, version: int, found: int) -> None:
    """Check that the events read after a snapshot at ``base`` up to ``version`` are all there.

    Raises:
        StorageError: ``found`` is not ``version - base``.
    """
    if found != version - base:
        raise StorageError(
            f"session {session!r}: events {base + 1}..{version} are incomplete "
            f"({found} of {version - base} found); run `eventstore verify`"
        )


def missing_blob(version: int) -> StorageError:
    """The error for a snapshot whose message blobs are not all stored."""
    return StorageError(
        f"snapshot at version {version} refers to a missing message blob; run `eventstore verify`"
    )


def state_from_parts(parts: LoadParts, version: int, codec: SnapshotCodec | None = None) -> State:
    """The state dict at ``version`` from a one-statement read (``Storage.load_parts``);
    ``codec``, if given, decodes the snapshot (:meth:`SnapshotCodec.load`: its cache)."""
    base = parts.snap_version
    state: State | None = None
    if parts.rest is not None:
        if parts.n_found != parts.n_digests:
            raise missing_blob(base)
        if codec is None:
            state = SnapshotCodec.decode(parts.rest, parts.bodies)
        else:
            state = codec.load(parts.rest, parts.bodies)
    assert parts.row is not None
    actions = orjson.loads(b"[" + parts.tail + b"]") if parts.n_tail else []
    if parts.sealed:
        actions = _with_sealed(actions, parts.sealed, base, version)
    return fold_tail(parts.row.id, base, version, state, actions)


def _with_sealed(rows: list[Any], sealed: tuple[tuple[int, bytes], ...], base: int, version: int) -> list[Any]:
    """The actions ``base + 1..version`` in order: the sealed ones at their versions, the
    rows' (``rows``, in version order) in the versions between (fewer: fold_tail says so)."""
    # One parse of them all, as for the rows' tail: hundreds of calls cost more.
    parsed = orjson.loads(b"[" + b",".join([p for _, p in sealed]) + b"]")
    if len(rows) + len(sealed) != version - base:
        return rows + parsed  # incomplete: fold_tail refuses
    if not rows:
        return parsed  # type: ignore[no-any-return]
    at = dict(zip([v for v, _ in sealed], parsed))
    it = iter(rows)
    return [at[v] if v in at else next(it) for v in range(base + 1, version + 1)]


# -- records ----------------------------------------------------------------------------


def recorded(e: EventRow, session_id: str, position: str | None = None) -> RecordedEvent:
    """The public record of a stored event (``position``: its feed position, if read
    from the feed)."""
    return RecordedEvent(
        session_id=session_id,
        version=e.version,
        event_id=e.event_id,
        type=e.type,
        action=decode_payload(e.payload),
        turn=e.turn,
        recorded_at=to_datetime(e.recorded_at),
        actor=e.actor,
        metadata=decode_metadata(e.metadata),
        hash=e.hash.hex(),
        position=position,
        native_bytes=e.native,
    )


def recorded_from_feed(r: FeedRow) -> RecordedEvent:
    """The public record of an event read from the feed, with its feed position."""
    # Unpacked once (the feed makes these by the thousand): a tuple unpack is a fraction of
    # the cost of a dozen named-field lookups. Bytes and memoryviews both have .hex().
    (
        session_pk, version, event_id, type_, turn, payload, recorded_at, actor, metadata, hash_,
        xact, session_id, native,
    ) = r
    return RecordedEvent(
        session_id=session_id,
        version=version,
        event_id=event_id,
        type=type_,
        action=decode_payload(payload),
        turn=turn,
        recorded_at=to_datetime(recorded_at),
        actor=actor,
        metadata=decode_metadata(metadata),
        hash=hash_.hex(),
        position=feed_position(xact, session_pk, version),
        native_bytes=None if native is None else bytes(native),
    )
