"""The engine's pure half: rows in, rows and plans out. No storage, no clock, no I/O.

Everything here works on the plain rows storage returns (:class:`SessionRow`,
:class:`EventRow`, :class:`SnapshotRow`, :class:`LoadParts`) and on state dicts, so the
synchronous engine (:mod:`eventstore.engine`) and an asyncio twin over async storage run
the very same validation results, hashing, snapshot planning and folding; they differ only
in how they fetch and write rows.

- Lineage: :func:`segments`, :func:`baselines`, :func:`history_segments`,
  :func:`lineage_segments` (where each version of a branch lives).
- Versions: :func:`check_version`, :func:`known_hash_turn`.
- Appends: :func:`event_rows` (versions, turns, chained hashes), :func:`replayed`
  (an idempotent retry), :class:`AppendPlanner` (which snapshots an append reaches, and
  the per-process caches that make this cheap).
- Loads: :func:`state_from_parts`, :func:`fold_tail`.
- Records: :func:`recorded`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .codec import SnapshotCodec, chain_hash, decode_metadata, decode_payload
from .diff import LineageSegment
from .errors import CompactedError, EventIdConflict, InvalidEvent, StorageError, VersionNotFound
from .feed import position as feed_position
from .records import AppendResult, RecordedEvent, to_datetime
from .reducer import REDUCER_VERSION, fold_json
from .storage.base import ZERO_HASH, EventRow, FeedRow, LoadParts, Segment, SessionRow, SnapshotRow

__all__ = [
    "State",
    "AppendPlan",
    "AppendPlanner",
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
    "recorded",
    "recorded_from_feed",
    "head_after",
    "missing_blob",
]

#: A state dict in the wire shape (``SessionState.to_json()``); ``None`` is the initial state.
State = dict[str, Any]

_STATE_CACHE = 32
_HEADS_CACHE = 4096


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
    (what :func:`eventstore.diff.find_base` compares).

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
) -> tuple[list[EventRow], bytes, int]:
    """The batch's event rows after ``row``'s head: versions, turns, chained hashes.

    Returns:
        ``(rows, the new head hash, the new head turn)``.
    """
    prev, turn = row.head_hash, row.head_turn
    rows: list[EventRow] = []
    for i, (type_, payload) in enumerate(encoded):
        version = row.head + 1 + i
        if type_ == "send":
            turn += 1
        event_id = None if ids is None else ids[i]
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
        )
        rows.append(EventRow(row.pk, version, event_id, type_, turn, payload, now, actor, meta, prev))
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
) -> AppendResult:
    """The result of a retried batch whose ids are already recorded (``prior``).

    Raises:
        EventIdConflict: an id is recorded with other content.
        InvalidEvent: only some of the ids are recorded, or not as one batch.
    """
    by_id = {e.event_id: e for e in prior}
    for event_id, (_, payload) in zip(ids, encoded):
        e = by_id.get(event_id)
        if e is not None and (e.payload != payload or e.actor != actor or e.metadata != meta):
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


#: A session head as the append path caches it: a state (``None``: the initial state) and
#: the action dicts recorded since, oldest first.
_Head = tuple["State | None", list[dict[str, Any]]]


@dataclass(frozen=True)
class AppendPlan:
    """What an append writes besides its events.

    Attributes:
        snapshots: the snapshot rows the batch reaches.
        blobs: the message-chunk blobs they need.
        head: the new head as the planner caches it (``None``: nothing to cache).
    """

    snapshots: list[SnapshotRow]
    blobs: dict[bytes, bytes]
    head: _Head | None


class AppendPlanner:
    """Snapshot planning for appends, and the per-process caches that make it cheap.

    Two caches, each a guess that the write itself verifies, so a stale entry costs a
    slower path, never a wrong result:

    - the session rows this process left after its appends (the optimistic path's guess
      of the head, checked by the head-moving statement);
    - per session, the state at the head it last wrote, kept as a state plus the actions
      since, keyed by the chain hash so that another writer's append is never mistaken for
      ours.

    No cache of stored blobs: a snapshot always carries its blobs (see :meth:`snapshot`).

    Thread safety: one planner is shared by every thread using a store. Every cache entry
    is *taken* (popped) under a lock and put back after the commit, so two threads never
    extend the same cached head; the snapshot codec's caches are keyed by content and only
    ever hold correct entries, so races there cost only a re-encode.
    """

    def __init__(self, snapshot_every: int, codec: SnapshotCodec | None = None) -> None:
        if snapshot_every < 1:
            raise ValueError("snapshot_every must be positive")
        self.every = snapshot_every
        self.codec = codec or SnapshotCodec()
        self._lock = threading.Lock()
        self._states: OrderedDict[int, tuple[int, bytes, _Head]] = OrderedDict()
        self._reserved = 0
        self._heads: OrderedDict[str, SessionRow] = OrderedDict()

    def take_head(self, session: str) -> SessionRow | None:
        """The row this process left after its last append to ``session`` (removed from the
        cache: only one writer at a time may use it)."""
        with self._lock:
            return self._heads.pop(session, None)

    def plan(
        self, row: SessionRow, actions: list[dict[str, Any]], head: int, base: State | None = None
    ) -> AppendPlan | None:
        """The snapshots an append from ``row.head`` to ``head`` reaches, and the new head.

        The state at ``row.head`` comes from the cache, or from ``base`` when the caller
        read it from storage. Returns ``None`` when a snapshot is due and neither has it:
        the caller reads the state at ``row.head`` (inside its transaction) and asks again.

        The head is kept as a state plus the actions since it, folded only when a snapshot
        is due: folding one event into a state this fold does not own copies the path it
        changes, the list of every message included, so folding at each append would cost
        O(session) per event.
        """
        start = row.head
        boundaries = snapshot_boundaries(start, head, self.every)
        with self._lock:
            cached = self._states.pop(row.pk, None)
        state: State | None
        if cached is not None and cached[0] == start and cached[1] == row.head_hash:
            state, pending = cached[2]
            pending.extend(actions)
        elif start == 0:
            state, pending = None, list(actions)  # a new session: the chain starts here
        elif not boundaries:
            return AppendPlan([], {}, None)
        elif base is None:
            return None
        else:
            state, pending = base, list(actions)
        snaps: list[SnapshotRow] = []
        blobs: dict[bytes, bytes] = {}
        pos = head - len(pending)  # the version of ``state``
        for b in boundaries:
            state = fold_json(state, pending[: b - pos])
            del pending[: b - pos]
            pos = b
            snap, fresh = self.snapshot(row.pk, b, state)
            snaps.append(snap)
            blobs.update(fresh)
        return AppendPlan(snaps, blobs, (state, pending))

    def snapshot(self, pk: int, version: int, state: Mapping[str, Any]) -> tuple[SnapshotRow, dict[bytes, bytes]]:
        """A snapshot row of ``state`` and every blob it refers to.

        Every blob is sent with its snapshot, even one this process wrote before (the
        insert skips blobs already there): erasure collects blobs no snapshot uses, so a
        blob once stored may be gone, and only the writing transaction can make sure it is
        there. Collection locks snapshot writes out while it runs, so a snapshot and its
        blobs are always committed together.
        """
        rest, digests, blobs = self.codec.encode(state)
        return SnapshotRow(pk, version, REDUCER_VERSION, rest, digests), dict(blobs)

    def committed(self, row: SessionRow, plan: AppendPlan | None = None) -> None:
        """Remember what a committed append left: the new head row and its cached state
        (only after commit: a rolled-back head must not be taken as the session's)."""
        with self._lock:
            self._heads[row.id] = row
            if len(self._heads) > _HEADS_CACHE:
                self._heads.popitem(last=False)
            if plan is not None and plan.head is not None:
                self._states[row.pk] = (row.head, row.head_hash, plan.head)
                while len(self._states) > _STATE_CACHE + self._reserved:
                    self._states.popitem(last=False)

    def reserve(self, n: int) -> None:
        """Keep room for ``n`` more cached states (``n`` < 0 gives it back): each open
        streaming turn keeps its session's, or every flush past a snapshot boundary would
        read the state back when more sessions stream than the cache holds."""
        with self._lock:
            self._reserved += n

    def clear(self) -> None:
        """Forget every cached head and state."""
        with self._lock:
            self._states.clear()
            self._heads.clear()


# -- loads ------------------------------------------------------------------------------


def fold_tail(session: str, base: int, version: int, state: State | None, actions: list[Any]) -> State:
    """Fold the events after a snapshot at ``base`` up to ``version``.

    Raises:
        StorageError: fewer events than ``version - base`` were found.
    """
    if len(actions) != version - base:
        raise StorageError(
            f"session {session!r}: events {base + 1}..{version} are incomplete "
            f"({len(actions)} of {version - base} found); run `eventstore verify`"
        )
    return fold_json(state, actions)


def missing_blob(version: int) -> StorageError:
    """The error for a snapshot whose message blobs are not all stored."""
    return StorageError(
        f"snapshot at version {version} refers to a missing message blob; run `eventstore verify`"
    )


def state_from_parts(parts: LoadParts, version: int) -> State:
    """The state dict at ``version`` from a one-statement read (``Storage.load_parts``)."""
    base = parts.snap_version
    state: State | None = None
    if parts.rest is not None:
        if parts.n_found != parts.n_digests:
            raise missing_blob(base)
        state = SnapshotCodec.decode_joined(parts.rest, parts.messages)
    assert parts.row is not None
    actions = orjson.loads(b"[" + parts.tail + b"]") if parts.n_tail else []
    return fold_tail(parts.row.id, base, version, state, actions)


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
    )


def recorded_from_feed(r: FeedRow) -> RecordedEvent:
    """The public record of an event read from the feed, with its feed position."""
    # Unpacked once (the feed makes these by the thousand): a tuple unpack is a fraction of
    # the cost of a dozen named-field lookups. Bytes and memoryviews both have .hex().
    session_pk, version, event_id, type_, turn, payload, recorded_at, actor, metadata, hash_, xact, session_id = r
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
    )
