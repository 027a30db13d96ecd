"""The rows storage stores and returns: frozen records of ids, integers and bytes.

Both sides speak these: the storage backends read and write them, the pure planning in
:mod:`eventstore.core.appends` and :mod:`eventstore.core.turn_rules` computes them, and
nothing in them is a domain object (an action or a state is only ever its bytes here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "ZERO_HASH",
    "DIGEST_SIZE",
    "HASH_SIZE",
    "SessionRow",
    "NewSession",
    "EventRow",
    "SnapshotRow",
    "Segment",
    "LoadParts",
    "CompactionRow",
    "TombstoneRow",
    "RewindRow",
    "Erasure",
    "FeedRow",
    "FeedBarrier",
    "Band",
    "SessionControl",
    "TurnBatch",
    "CatalogueEffect",
    "NO_EFFECT",
    "CatalogueRow",
    "SealedEvent",
    "SegmentHead",
    "SealableTurn",
    "blob_refs",
]

#: The hash a root session's first event chains from.
ZERO_HASH = b"\x00" * 32

#: Bytes per message digest in a snapshot's ``message_digests`` (the codec's
#: ``DIGEST_SIZE``; storage only slices the concatenation, it never computes one).
DIGEST_SIZE = 16

#: Bytes of a chain hash (SHA-256).
HASH_SIZE = 32


def blob_refs(message_digests: Iterable[bytes]) -> dict[bytes, int]:
    """How many times snapshots with these ``message_digests`` name each blob.

    What a snapshot write adds to ``snapshot_blobs.refs`` and its deletion takes away; the
    digests in ascending order, the order every writer locks blob rows in (two writers
    locking the same rows in another order could deadlock).
    """
    counts: dict[bytes, int] = {}
    n = DIGEST_SIZE
    for md in message_digests:
        for i in range(0, len(md), n):
            d = md[i : i + n]
            counts[d] = counts.get(d, 0) + 1
    return dict(sorted(counts.items()))

@dataclass(frozen=True, slots=True)
class SessionRow:
    """One row of ``sessions``.

    Attributes:
        pk: surrogate key the events refer to.
        id: the session id callers use.
        parent_pk: the session this one was branched from, or ``None`` for a root.
        fork_version: the parent version the branch starts from (``None`` for a root).
        head: the newest version (a fresh branch's head is its fork version).
        head_hash: the hash of the event at ``head`` (the chain's tip).
        head_turn: the turn number at ``head``.
        baseline: versions below this were compacted away (0 = never compacted).
        baseline_hash: the hash at ``baseline`` (the chain restarts from it).
        baseline_turn: the turn number at ``baseline``.
        created_at: microseconds since the Unix epoch, UTC.
    """

    pk: int
    id: str
    parent_pk: int | None
    fork_version: int | None
    head: int
    head_hash: bytes
    head_turn: int
    baseline: int
    baseline_hash: bytes | None
    baseline_turn: int
    created_at: int


@dataclass(frozen=True, slots=True)
class NewSession:
    """A session row to insert (root: no parent, head 0; branch: parent + fork point)."""

    id: str
    created_at: int
    parent_pk: int | None = None
    fork_version: int | None = None
    head: int = 0
    head_hash: bytes = ZERO_HASH
    head_turn: int = 0
    baseline: int = 0
    baseline_hash: bytes | None = None
    baseline_turn: int = 0
    #: The catalogue's fold status and first user text at ``head`` (a branch's at its fork).
    status: str = "idle"
    first_text: str | None = None


@dataclass(frozen=True, slots=True)
class EventRow:
    """One row of ``events``: an immutable, hash-chained record of one action.

    Attributes:
        session_pk: the session that recorded the event.
        version: its position in the session (1-based, continuing a parent's numbering).
        event_id: the caller's idempotency id, or ``None``.
        type: the action type (``send``, ``part``, ...).
        turn: number of ``send`` events up to and including this one.
        payload: canonical JSON bytes of the action.
        recorded_at: microseconds since the Unix epoch, UTC.
        actor: who recorded it, or ``None``.
        metadata: canonical JSON bytes of a JSON object, or ``None``.
        hash: SHA-256 of the previous hash and this event's canonical envelope.
        native: the provider-native data stored with it (JSON text, byte-exact; the
            reducer never reads it), or ``None``.
    """

    session_pk: int
    version: int
    event_id: str | None
    type: str
    turn: int
    payload: bytes
    recorded_at: int
    actor: str | None
    metadata: bytes | None
    hash: bytes
    native: bytes | None = None


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    """One row of ``snapshots``: the state after ``version`` events, by reference.

    Attributes:
        session_pk: the session whose version this is.
        version: the state is the fold of events ``1..version`` of the session's lineage.
        reducer_version: the reducer that produced it; others are never served.
        rest: canonical JSON of the state without its messages.
        message_digests: the digests of the message chunks, concatenated in order;
            each names a row of ``snapshot_blobs``.
    """

    session_pk: int
    version: int
    reducer_version: int
    rest: bytes
    message_digests: bytes


@dataclass(frozen=True, slots=True)
class Segment:
    """Versions ``after < v <= upto`` of a lineage that live in session ``session_pk``."""

    session_pk: int
    after: int
    upto: int


@dataclass(frozen=True, slots=True)
class LoadParts:
    """Everything a load of a root session needs, read by one statement.

    Attributes:
        row: the session row, or ``None`` when there is no such session.
        complete: ``False`` when the session is a branch (its lineage is read the
            general way); the fields below are then empty.
        snap_version: the version of the snapshot used (0: none, fold from the start).
        rest: the snapshot's ``rest`` bytes, or ``None`` without a snapshot.
        bodies: the snapshot's stored blobs, in its order (the codec decodes them).
        n_digests: how many blobs the snapshot lists.
        n_found: how many of them have a blob (fewer: a blob is missing).
        tail: the payloads of the events after the snapshot up to the version, joined by
            commas in version order (no brackets).
        n_tail: how many events ``tail`` holds.
        sealed: ``(version, payload)`` of the events after the snapshot that are sealed
            (not in ``tail``), in version order; ``tail`` holds the others.
    """

    row: SessionRow | None
    complete: bool = False
    snap_version: int = 0
    rest: bytes | None = None
    bodies: tuple[bytes, ...] = ()
    n_digests: int = 0
    n_found: int = 0
    tail: bytes = b""
    n_tail: int = 0
    sealed: tuple[tuple[int, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class CompactionRow:
    """One row of ``compactions``: a compaction bound to the chain.

    Attributes:
        session_pk: the session compacted.
        upto: the new baseline version.
        previous_baseline: the baseline before (0: first compaction).
        baseline_hash: the chain hash at ``upto``.
        baseline_turn: the turn number at ``upto``.
        state_digest: the store's digest of the state at ``upto`` (what the baseline
            snapshot must hash to).
        first_version: the version of the first hash in ``removed_hashes``.
        removed_hashes: the chain hashes of the session's own versions
            ``first_version..upto``, 32 bytes each, in version order.
        compacted_at: microseconds since the Unix epoch, UTC.
        actor: who compacted (``None`` when not given).
    """

    session_pk: int
    upto: int
    previous_baseline: int
    baseline_hash: bytes
    baseline_turn: int
    state_digest: bytes
    first_version: int
    removed_hashes: bytes
    compacted_at: int
    actor: str | None

    def hash_at(self, version: int) -> bytes | None:
        """The chain hash this compaction recorded for ``version``, or ``None``."""
        i = version - self.first_version
        if i < 0 or (i + 1) * HASH_SIZE > len(self.removed_hashes):
            return None
        return self.removed_hashes[i * HASH_SIZE : (i + 1) * HASH_SIZE]


@dataclass(frozen=True, slots=True)
class TombstoneRow:
    """One row of ``tombstones``: a session erased on request.

    Attributes:
        session_id: the erased session's id (never reused).
        head: its head version when erased.
        head_hash: the chain hash at that head.
        erased_at: microseconds since the Unix epoch, UTC.
        actor: who erased it (``None`` when not given).
        reason: why.
        erased_with: the id of the session whose erasure took this branch with it;
            ``None`` for the session the erasure named.
    """

    session_id: str
    head: int
    head_hash: bytes
    erased_at: int
    actor: str | None
    reason: str
    erased_with: str | None = None


@dataclass(frozen=True, slots=True)
class RewindRow:
    """One row of ``session_rewinds``.

    Attributes:
        session_id: the id that was rewound.
        kept_id: the id the old line is kept under.
        kept_pk: the row that holds the old line (renamed to ``kept_id``).
        new_pk: the row the rewind made for ``session_id`` (a branch of ``kept_pk``).
        from_head: the head before the rewind (the kept line's head).
        from_hash: the chain hash at ``from_head``.
        to_version: the version the session was rewound to.
        rewound_at: microseconds since the Unix epoch, UTC.
        actor: who rewound it (``None`` when not given).
        reason: why (``None`` when not given).
        seq: the record's number (rewinds in the order they were made).
    """

    session_id: str
    kept_id: str
    kept_pk: int
    new_pk: int
    from_head: int
    from_hash: bytes
    to_version: int
    rewound_at: int
    actor: str | None
    reason: str | None
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Erasure:
    """What :meth:`Storage.erase_session` removed.

    Attributes:
        tombstones: one per erased session, the named one first, then its branches
            (parents before children).
        events: event rows deleted.
        snapshots: snapshot rows deleted.
        blob_candidates: digests the deleted snapshots referenced (those no other
            snapshot names were deleted with them).
    """

    tombstones: tuple[TombstoneRow, ...]
    events: int
    snapshots: int
    blob_candidates: frozenset[bytes]


class FeedRow(NamedTuple):
    """One event as the feed reads it: the columns of its row (as :class:`EventRow`,
    its native data last), its feed number and its session's id. A tuple, built straight from the driver's row:
    the feed reads events by the thousand.

    The feed's order is ``(xact, session_pk, version)``.
    """

    session_pk: int
    version: int
    event_id: str | None
    type: str
    turn: int
    payload: bytes
    recorded_at: int
    actor: str | None
    metadata: bytes | None
    hash: bytes
    xact: int
    session_id: str
    native: bytes | None = None


@dataclass(frozen=True, slots=True)
class FeedBarrier:
    """Where the feed may read up to, now.

    Attributes:
        below: only rows with ``xact < below`` are final (PostgreSQL: the oldest transaction
            that can still write an event); ``None`` when every committed row is final (SQLite).
        pending: committed rows at or above ``below`` exist (they wait for an older
            transaction to end).
    """

    below: int | None
    pending: bool = False


@dataclass(frozen=True, slots=True)
class Band:
    """One band of a banded feed, as :meth:`Storage.read_feed` read it.

    Attributes:
        below: the barrier the band was read under (as :attr:`FeedBarrier.below`).
        rows: the band's events in feed order.
        pending: committed rows at or above ``below`` exist, in the same snapshot.
    """

    below: int
    rows: list[FeedRow]
    pending: bool


@dataclass(frozen=True, slots=True)
class SessionControl:
    """Who may write a session's stream, and whether it is closed (from ``sessions``).

    Attributes:
        pk: the session's surrogate key.
        head: its newest version.
        head_hash: the chain hash at ``head``.
        writer: the token of the streaming turn that holds the session's lease, or ``None``.
        writer_seen: when that turn last flushed or renewed its lease (microseconds since
            the Unix epoch), or ``None``.
        closed_at: when the session was closed to writes (microseconds), or ``None``.
        closed_reason: why it was closed, or ``None``.
        head_type: the action type of the event at ``head`` when it is the session's own
            (``None`` for a branch still at its fork point, or when not read).
        head_payload: that event's payload bytes (``None`` likewise).
        head_recorded_at: that event's ``recorded_at`` (``None`` likewise).
    """

    pk: int
    head: int
    head_hash: bytes
    writer: str | None
    writer_seen: int | None
    closed_at: int | None
    closed_reason: str | None
    head_type: str | None = None
    head_payload: bytes | None = None
    head_recorded_at: int | None = None


@dataclass(frozen=True, slots=True)
class TurnBatch:
    """What one streaming turn writes in a group commit (:meth:`Storage.append`).

    Attributes:
        session_pk: the session.
        old_head: the head the turn last saw; the batch is written only if it still is.
        old_hash: the chain hash at ``old_head``.
        writer: the turn's lease token; the batch is written only if it still holds it.
            ``None``: a plain append (a group commit of appends), which neither checks nor
            changes the lease.
        seen_at: the new ``writer_seen`` (microseconds).
        rows: the events (may be empty: then the batch only renews the lease and checks
            that nothing else was appended).
        head_turn: the turn number after the last row.
        snapshots: the snapshot rows the batch reaches.
        blobs: the message blobs they add.
        release: give the lease up (``writer`` becomes ``NULL``) with this batch.
        claim: take the lease (the batch opens a turn, or goes on after the turn's run
            ended): written only if no turn holds it. With ``release`` too, the lease is
            checked free and stays free.
    """

    session_pk: int
    old_head: int
    old_hash: bytes
    writer: str | None
    seen_at: int
    rows: Sequence[EventRow]
    head_turn: int
    snapshots: Sequence[SnapshotRow] = ()
    blobs: Mapping[bytes, bytes] = field(default_factory=dict)
    release: bool = False
    claim: bool = False
    effect: CatalogueEffect | None = None


@dataclass(frozen=True, slots=True)
class CatalogueEffect:
    """What a batch of events does to a session's catalogue columns (``sessions.status``,
    ``first_text``, ``updated_at``), decided without reading the session's state.

    The write applies it to the row it moves, reading the old values (see
    :mod:`eventstore.core.catalogue`): ``first_text`` is not ``NULL`` exactly when the
    state holds a user message, which is all a ``retry`` needs to know.

    Attributes:
        updated_at: the batch's ``recorded_at`` (``None``: unchanged).
        status_with_user: the status after the batch if the state before it holds a user
            message (``None``: unchanged).
        status_without_user: likewise if it holds none.
        reset: the batch resets the state: ``first_text`` becomes ``first_text`` below.
        first_text: the first user text the batch adds (cut), or ``None``.
    """

    updated_at: int | None
    status_with_user: str | None
    status_without_user: str | None
    reset: bool
    first_text: str | None


#: A batch that changes nothing in the catalogue (a lease renewal).
NO_EFFECT = CatalogueEffect(None, None, None, False, None)


@dataclass(frozen=True, slots=True)
class CatalogueRow:
    """One session as the catalogue lists it (``sessions`` columns, decoded by the engine).

    Attributes:
        pk, id, parent_pk, fork_version, head, baseline, head_turn, created_at: as in
            :class:`SessionRow`.
        closed_at, closed_reason, writer, writer_seen: as in :class:`SessionControl`.
        title: the title set by ``set_info``, or ``None``.
        first_text: the state's first user text (cut), or ``None``.
        owner: the owner set by ``set_info``, or ``None``.
        metadata: canonical JSON text of the info metadata, or ``None`` (unset).
        updated_at: microseconds: the newest own event's time (or the creation's).
        status: the fold's status at ``head``.
        line_of: the pk of the session a kept line was rewound away from, or ``None``.
        parent_id: the parent's id (``None`` for a root, or when not read).
        interrupted: the event at ``head`` is the session's own interruption part (when read).
    """

    pk: int
    id: str
    parent_pk: int | None
    fork_version: int | None
    head: int
    baseline: int
    head_turn: int
    created_at: int
    closed_at: int | None
    closed_reason: str | None
    writer: str | None
    writer_seen: int | None
    title: str | None
    first_text: str | None
    owner: str | None
    metadata: str | None
    updated_at: int
    status: str
    line_of: int | None
    parent_id: str | None = None
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class SealedEvent:
    """An event row with its feed number: what a sealed segment is made of and decodes to."""

    row: EventRow
    xact: int


@dataclass(frozen=True, slots=True)
class SegmentHead:
    """The columns of an ``event_segments`` row other than its body.

    Attributes:
        session_pk: the session whose rows the segment replaced.
        first_version: the first event's version.
        last_version: the last event's version.
        prev_hash: the chain hash before ``first_version``.
        end_hash: the chain hash of ``last_version`` (copied by the database from the row).
        xact_digest: the digest of the events' feed numbers, in version order.
        min_xact: the lowest feed number in the segment.
        max_xact: the highest one.
    """

    session_pk: int
    first_version: int
    last_version: int
    prev_hash: bytes
    end_hash: bytes
    xact_digest: bytes
    min_xact: int
    max_xact: int


@dataclass(frozen=True, slots=True)
class SealableTurn:
    """Closed turns ``turn..last_turn`` of a session whose events are still rows: versions
    ``first..last`` (one turn as listed; consecutive ones joined into one segment)."""

    session_pk: int
    turn: int
    first: int
    last: int
    last_turn: int

    @property
    def turns(self) -> int:
        """How many turns these are."""
        return self.last_turn - self.turn + 1
