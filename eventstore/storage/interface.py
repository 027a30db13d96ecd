"""The storage interface: what the engine asks of a database, in bytes and integers.

Storage never sees a domain object. It stores and returns frozen records of ids,
integers and bytes (:class:`SessionRow`, :class:`EventRow`, :class:`SnapshotRow`); the
engine turns them into actions and states through the codec.

A call runs inside a transaction the caller opens::

    with storage.write() as tx:          # BEGIN IMMEDIATE on SQLite; row locks on PostgreSQL
        row = storage.session(tx, id="s1", lock=True)
        storage.insert_events(tx, rows)
        storage.update_session(tx, row.pk, head=(head, head_hash, head_turn))

Readers that differ only by a filter are one method with keyword-only arguments: a range
of versions (``after < version <= upto``), a key or an id, a lock. ``read()`` and
``write()`` are where driver exceptions become the error tree (:mod:`eventstore.errors`):
exactly one context manager does that, in ``sql/transactions.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol, TypeVar, overload

from eventstore.core.rows import (
    Band,
    CompactionRow,
    Erasure,
    EventRow,
    LoadParts,
    NewSession,
    RewindRow,
    SealableTurn,
    SealedEvent,
    Segment,
    SegmentHead,
    SessionControl,
    SessionRow,
    SnapshotRow,
    TombstoneRow,
    TurnBatch,
)
from eventstore.errors import StorageError

__all__ = [
    "Storage",
    "Tx",
    "EventIdRace",
    "ChangeWatcher",
    "AsyncChangeWatcher",
    "SegmentCoder",
    "MAX_VERSION",
    "AuditRecord",
]

#: Above every version a session can have (versions are int4): ``upto`` of a whole log.
MAX_VERSION = 2**31 - 1
#: The kinds of audit records :meth:`Storage.records` reads.
AuditRecord = TypeVar("AuditRecord", CompactionRow, TombstoneRow, RewindRow)

#: An open transaction, opaque to callers (a SQLAlchemy ``Connection`` in practice).
Tx = Any


class ChangeWatcher(ABC):
    """Wakes readers when events may have been committed (a hint, never the data).

    A reader notes :meth:`generation`, reads, and then calls :meth:`wait` with the noted
    generation: anything committed after the note makes the generation move, so no commit
    is slept through. Waits are bounded by ``timeout`` in any case.
    """

    @abstractmethod
    def generation(self) -> int:
        """A number that changes whenever a commit may have happened since."""

    @abstractmethod
    def wait(self, seen: int, timeout: float | None) -> int:
        """Block until the generation differs from ``seen`` or ``timeout`` seconds pass
        (``None``: no limit); return the current generation."""

    @abstractmethod
    def wake(self) -> None:
        """Wake every reader now (a follower being closed from another thread)."""

    @abstractmethod
    def close(self) -> None:
        """Stop watching and release the connection."""


class AsyncChangeWatcher(ABC):
    """The asyncio twin of :class:`ChangeWatcher` (the same protocol, awaited)."""

    @abstractmethod
    async def generation(self) -> int:
        """As :meth:`ChangeWatcher.generation`."""

    @abstractmethod
    async def wait(self, seen: int, timeout: float | None) -> int:
        """As :meth:`ChangeWatcher.wait`, without blocking the event loop."""

    @abstractmethod
    def wake(self) -> None:
        """Wake every waiting reader now."""

    @abstractmethod
    async def close(self) -> None:
        """Stop watching and release the connection."""


class EventIdRace(StorageError):
    """Another transaction recorded one of the batch's event ids first.

    Internal: the store catches it, re-reads the ids and decides between the original
    result and :class:`~eventstore.errors.EventIdConflict`.
    """

    def __init__(self) -> None:
        super().__init__("an event id was recorded concurrently; retry", retryable=True)


class SegmentCoder(Protocol):
    """How sealed segment bodies are made and checked (``eventstore.core.segments``): the
    engine hands it to its storage, which moves the bytes and imports no codec."""

    def encode(self, events: Sequence[SealedEvent], hashed_as: str) -> bytes:
        """The body of consecutive events hashed under the session id ``hashed_as``."""
        ...

    def decode(self, head: SegmentHead, body: bytes) -> list[SealedEvent]:
        """The events of a segment, hashes recomputed; raises ``SegmentCorrupt``."""
        ...

    def payloads(self, head: SegmentHead, body: bytes, after: int, upto: int) -> list[tuple[int, bytes]]:
        """``(version, payload)`` of a segment's events in ``(after, upto]``, checked as
        :meth:`decode` checks them; raises ``SegmentCorrupt``."""
        ...

    def chain_end(self, prev: bytes, hashed_as: str, rows: Sequence[EventRow]) -> bytes:
        """The chain hash after ``rows`` recomputed from ``prev``."""
        ...

    def xact_digest(self, xacts: Sequence[int]) -> bytes:
        """The digest of feed numbers in version order (``event_segments.xact_digest``)."""
        ...


class Storage(Protocol):
    """A database holding sessions, events and snapshots.

    Implementations: :class:`~eventstore.storage.sqlite.SQLiteStorage` and
    :class:`~eventstore.storage.postgres.PostgresStorage`, sharing their statements in
    :class:`~eventstore.storage.sql.SqlStorage`. ``tests/test_boundaries.py`` keeps this
    at most 30 methods: a new need is first a keyword of an existing one.
    """

    #: the SQLAlchemy dialect name ("sqlite" or "postgresql").
    dialect: str
    #: the URL with any password masked, for messages.
    safe_url: str
    #: The feed reads bands of ``xact`` (``upto`` of :meth:`read_feed`) because its index
    #: cannot return rows in feed order (PostgreSQL's BRIN index); see eventstore/core/feed_rules.py.
    feed_banded: bool = False

    # -- transactions and schema --------------------------------------------------------

    def read(self) -> AbstractContextManager[Tx]:
        """Open a read transaction (a consistent snapshot on both backends).

        Raises:
            SchemaError: the database is not migrated.
            StorageError: the database failed (``retryable`` set when a retry may work).
        """
        ...

    def write(
        self, *, session: str | None = None, expected: int | None = None
    ) -> AbstractContextManager[Tx]:
        """Open a write transaction, committed when the block exits without an exception.

        Args:
            session: the session being appended to, for the message of a ConcurrencyError.
            expected: the caller's expected version, likewise.

        SQLite takes the database write lock at BEGIN (``BEGIN IMMEDIATE``); PostgreSQL
        locks only the session rows the block locks.

        Raises:
            ConcurrencyError: a concurrent append took the version (event primary key).
            EventIdRace: a concurrent append recorded one of the event ids.
            SchemaError, StorageError: as for :meth:`read`.
        """
        ...

    def close(self) -> None:
        """Release every connection (dispose the engine)."""

    def migrate(self) -> None:
        """Upgrade the schema to the newest revision (idempotent; safe to run concurrently)."""

    def schema_revision(self) -> str | None:
        """The applied revision, or ``None`` when the database has no eventstore schema."""

    def fetch_all(self, key: Any, stmt: Any, params: Mapping[str, Any]) -> list[Any]:
        """Every row of one read-only Core statement run on its own (one snapshot; on
        PostgreSQL in autocommit, compiled once per ``key``, the statement's shape)."""
        ...

    # -- sessions -----------------------------------------------------------------------

    def session(
        self,
        tx: Tx,
        *,
        id: str | None = None,
        pk: int | None = None,
        lock: bool = False,
        wait: bool = True,
    ) -> SessionRow | None:
        """The session row with this ``id`` or this key ``pk``, or ``None``.

        ``lock``: hold the row lock until the transaction ends (what serialises appends
        to one session; other sessions are not blocked). By ``pk`` without ``wait``, a row
        another transaction holds is skipped (``None``): the sealer comes back later.
        """
        ...

    def sessions(self, tx: Tx, *, descendants_of: int | None = None) -> list[SessionRow]:
        """Every session, oldest first; or every branch forked from ``descendants_of``,
        transitively, parents before children."""
        ...

    def insert_session(self, tx: Tx, new: NewSession) -> SessionRow | None:
        """Insert a session row; ``None`` (and nothing written) when the id is taken."""
        ...

    def update_session(
        self,
        tx: Tx,
        pk: int,
        *,
        head: tuple[int, bytes, int] | None = None,
        writer: tuple[str | None, int | None] | None = None,
        only_if: str | None = None,
        closed: tuple[int, str | None] | None = None,
    ) -> bool:
        """Change a session row (the caller holds its lock, or owns its lease).

        Args:
            head: move the head to ``(version, hash, turn)``.
            writer: set (token) or clear (``None``) the writer lease, ``(token, seen_at)``;
                ``only_if``: only while this token holds it.
            closed: close the session to writes, ``(closed_at, reason)``.

        Returns:
            Whether the row changed (the lease's condition held).
        """
        ...

    def controls(
        self, tx: Tx, pk: int | None = None, *, with_head_event: bool = False
    ) -> dict[int, SessionControl]:
        """The lease and closed columns of one session (it must exist) or, without ``pk``,
        of every session with their head events, by key.

        ``with_head_event``: also read the type, payload and time of the event at the head
        when it is the session's own.
        """
        ...

    # -- appends ------------------------------------------------------------------------

    def append(self, batches: Sequence[TurnBatch]) -> list[bool]:
        """Write sessions' batches in ONE transaction of its own: every append goes here.

        Each batch moves its session's head only if the head is still ``(old_head,
        old_hash)``, the turn still holds the lease (a batch without a ``writer`` neither
        checks nor changes it) and the session is not closed; then its rows, snapshots and
        their blobs are written and its catalogue ``effect`` applied. A batch that fails
        its check writes nothing; the others are written all the same. One plain batch
        is the optimistic append (PostgreSQL: one statement, one round trip).

        Returns:
            For each batch, whether it was written.

        Raises:
            EventIdRace: an event id is already recorded (nothing was written).
            StorageError: the database failed (nothing was written, or — for a lost
                connection at commit — maybe everything: the caller's retry finds out).
        """
        ...

    def insert_events(self, tx: Tx, rows: Sequence[EventRow], *, before: int | None = None) -> bool:
        """Insert a batch of events in one round trip where the driver allows.

        ``before``: put back events of one session below its event at version ``before``
        (an import undoing a compaction), at feed positions that keep the session in
        version order: right before the event at ``before`` — not after every event
        committed since — so that a feed read from the start yields the session in
        version order, and a feed that has read past that event does not yield them. With
        no event at ``before``, they are inserted as any insert is.

        Returns:
            ``False`` when restored rows cannot get such positions (SQLite, whose positions
            are row numbers: the free numbers between the neighbours ran out); then
            nothing was written.
        """
        ...

    # -- events -------------------------------------------------------------------------

    @overload
    def read_events(
        self,
        tx: Tx,
        session_pk: int,
        *,
        after: int = 0,
        upto: int = MAX_VERSION,
        limit: int | None = None,
        desc: bool = False,
        ids: Sequence[str] | None = None,
        payloads: Literal[False] = False,
    ) -> list[EventRow]: ...

    @overload
    def read_events(
        self, tx: Tx, session_pk: int, *, after: int = 0, upto: int = MAX_VERSION, payloads: Literal[True]
    ) -> list[bytes]: ...

    def read_events(
        self,
        tx: Tx,
        session_pk: int,
        *,
        after: int = 0,
        upto: int = MAX_VERSION,
        limit: int | None = None,
        desc: bool = False,
        ids: Sequence[str] | None = None,
        payloads: bool = False,
    ) -> list[EventRow] | list[bytes]:
        """Events with ``after < version <= upto`` of one session, in version order (rows
        and sealed segments merged).

        Args:
            limit: at most this many (the first ones, or with ``desc`` the last ones,
                newest first).
            ids: instead of a range, the events carrying any of these ids.
            payloads: only their payloads (the fold's fast path).
        """
        ...

    def recorded_hash(self, tx: Tx, session_pk: int, version: int) -> bytes | None:
        """The chain hash the database holds for a version of this session's own events.

        The event row's hash when the row is there; otherwise the hash a compaction
        recorded for it; ``None`` when neither (a version at or below a branch's fork
        lives in the parent: ask the parent).
        """
        ...

    # -- sealed segments ------------------------------------------------------------------

    def sealed_id_mismatches(
        self, tx: Tx, session_pk: int
    ) -> list[tuple[int, str | None, str | None]]:
        """Where a session's ``sealed_event_ids`` disagrees with its sealed events, as
        ``(version, id the segment holds, id the table names)`` in version order (``None``:
        no id). The table is written with the segments, so any entry here is an edit made
        behind the library's back; a missing id would let a retried append of a sealed
        event through as a new one. Decodes every segment of the session (``verify``).

        Raises:
            SegmentCorrupt: a segment does not decode.
        """
        ...

    def sealable_turns(self, tx: Tx, session_pk: int | None, limit: int) -> list[SealableTurn]:
        """Up to ``limit`` turns whose events are still rows and that a later turn of the
        same session has closed (of one session, or of all), oldest session first."""
        ...

    def seal_turns(
        self, tx: Tx, row: SessionRow, turns: Sequence[SealableTurn], hashed_as: str,
        stop: Callable[[], bool] | None = None,
    ) -> list[SealableTurn]:
        """Rewrite closed turns of one session into one segment each and delete their rows,
        in ``tx`` (the caller locked the row: :meth:`session` with ``lock``); the turns
        sealed.

        A turn is left out (nothing written for it; a later call tries it again) when its
        rows are no longer all there, do not hash to their recorded chain under
        ``hashed_as``, or (PostgreSQL) are not yet below the feed's barrier. With ``stop``
        the turns are sealed one at a time, oldest first, and ``stop()`` is asked before
        each: once it answers true, the rest are left out too.
        """
        ...

    # -- snapshots ----------------------------------------------------------------------

    def snapshots(
        self,
        tx: Tx,
        segments: Sequence[Segment],
        *,
        usable_by: int | None = None,
        baselines: Sequence[tuple[int, int]] = (),
    ) -> list[SnapshotRow]:
        """The snapshots with ``after < version <= upto`` of each segment, in order; or,
        with ``usable_by`` (a reducer version), only the newest one inside the segments
        (``after <= version``) that reducer made.

        A snapshot at a compaction baseline ``(session_pk, version)`` of ``baselines`` is
        usable whatever its reducer version: the events it stands for are gone.
        """
        ...

    def put_snapshot(self, tx: Tx, snap: SnapshotRow, blobs: Mapping[bytes, bytes]) -> None:
        """Store a snapshot (replacing one at the same version) and the blobs it adds.

        Blobs already present keep their bytes (content-addressed); every blob the snapshot
        names has its reference count raised, in this transaction. ``blobs`` holds the
        bodies of every blob it names, except blobs an earlier snapshot of the same
        transaction sent (their rows are already written and locked by it).
        """

    def thin_snapshots(
        self, tx: Tx, session_pk: int, *, first: int, last: int, keep_every: int
    ) -> int:
        """Delete the snapshots of a session row between ``first`` and ``last`` that lie
        inside its sealed segments, except those at a multiple of ``keep_every``, the
        compaction baseline and the row's newest; release their blobs (a blob no snapshot
        names any more is deleted). The number of snapshots deleted. The caller holds the
        session's lock. PostgreSQL: through the owner's ``eventstore_thin_snapshots``.
        """
        ...

    def ordered_bodies(self, tx: Tx, message_digests: bytes) -> list[bytes | None]:
        """The bodies of a snapshot's concatenated digests, in their order (``None``: missing)."""
        ...

    def load_parts(
        self, session_id: str, version: int | None, reducer_version: int
    ) -> LoadParts | None:
        """A root session's state parts at ``version`` (``None``: the head), in one read.

        The newest usable snapshot at or below the version (as :meth:`snapshots` with the
        session's compaction baseline), its stored blobs in order and the payloads of the
        events after it. ``None`` when the backend has no such statement (the engine then
        reads the parts one by one).
        """
        ...

    # -- compaction, erasure, rewinds: history rewritten, and its audit records -----------

    def compact(
        self,
        tx: Tx,
        session_pk: int,
        *,
        upto: int,
        keep_upto: int,
        baseline_hash: bytes,
        baseline_turn: int,
    ) -> int:
        """Make ``upto`` the session's baseline and delete what it replaces.

        The caller has already stored the baseline snapshot at ``upto`` and the compaction
        record (:meth:`insert_compaction`) in the same transaction. Deletes the session's
        events with ``keep_upto < version <= upto`` (branches need the events at or below
        their fork versions, ``keep_upto``) and its snapshots with ``keep_upto < version <
        upto``, under a compaction permit that the database's immutability trigger checks
        and that is gone again before commit.

        Returns:
            the number of events deleted.
        """
        ...

    def insert_compaction(self, tx: Tx, rec: CompactionRow) -> None:
        """Write a compaction record as given (``removed_hashes`` may be empty: an import
        of a compacted session, whose removed versions never were in this database).

        Raises:
            StorageError: a record for this session and ``upto`` exists.
        """

    def records(
        self,
        tx: Tx,
        kind: type[AuditRecord],
        *,
        session_pk: int | None = None,
        session_id: str | None = None,
        pks: Collection[int] | None = None,
    ) -> list[AuditRecord]:
        """Audit records of one kind, oldest first.

        ``CompactionRow``: of the session ``session_pk``, lowest ``upto`` first.
        ``TombstoneRow``: of the erased id ``session_id``, or every one (by id).
        ``RewindRow``: of one rewound ``session_id``, or whose kept or new row is one of
        ``pks``, or (neither given) every one.
        """
        ...

    def erase_session(
        self,
        tx: Tx,
        session_pk: int,
        *,
        erased_at: int,
        actor: str | None,
        reason: str,
    ) -> Erasure:
        """Erase a session and every branch forked from it, leaving a tombstone for each.

        Deletes their events (under a compaction permit covering every version, removed
        again before returning), snapshots (and the blobs no other snapshot names),
        compaction records and session rows, and writes the tombstones. The caller holds
        the session's lock. Only the schema
        owner (or a role granted the same) can: the application role is refused.

        Raises:
            StorageError: permission denied, or a tombstone for one of the ids exists.
        """
        ...

    def rewind_session(
        self,
        tx: Tx,
        rec: RewindRow,
        *,
        closed_at: int,
        reason: str,
        new: NewSession | None = None,
    ) -> SessionRow | None:
        """Keep a session's line under another id and give its id a new row (a rewind).

        Row ``rec.kept_pk`` is renamed to ``rec.kept_id``, closed to writes (``reason``)
        and marked as a line of the new row; ``new`` (the session id, a branch of the
        kept row) is inserted; the audit record ``rec`` (its ``new_pk`` filled in) is
        written. No event row is touched. The caller holds the session's lock.

        Without ``new``, a rewind an export carried is written back (an import): row
        ``rec.kept_pk``, already named ``rec.kept_id``, is marked as a line of row
        ``rec.new_pk``, which exists.

        Returns:
            The new row (``None`` for a write-back).

        Raises:
            StorageError: the role may not, or an id is taken.
        """
        ...

    # -- feed -----------------------------------------------------------------------------

    def read_feed(
        self, *, after: tuple[int, int, int] | None, limit: int, upto: int | None = None
    ) -> Band:
        """Events in feed order after the key ``(xact, session_pk, version)``, at most
        ``limit``, in a read transaction of their own, and whether committed events wait
        behind an older open transaction (``pending``).

        A :attr:`feed_banded` storage reads one band: the barrier ``below`` (as
        :attr:`FeedBarrier.below`), the events with ``xact <= min(upto, below - 1)`` —
        final events: no event can ever be added before them —, and whether committed
        events wait at or above the barrier, all read by one statement in one snapshot.
        Otherwise (every committed event final) ``upto`` is not used.
        """
        ...

    @overload
    def watcher(self, *, asyncio: Literal[False] = False) -> ChangeWatcher: ...

    @overload
    def watcher(self, *, asyncio: Literal[True]) -> AsyncChangeWatcher: ...

    def watcher(self, *, asyncio: bool = False) -> ChangeWatcher | AsyncChangeWatcher:
        """The storage's change watcher (one per storage, started on first use; its
        dedicated connection is released by :meth:`close`). ``asyncio``: the watcher of a
        storage opened for asyncio (a task on its event loop)."""
        ...
