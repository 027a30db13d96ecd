"""The storage interface: what the store asks of a database, in bytes and integers.

Storage never sees a domain object. It stores and returns frozen records of ids,
integers and bytes (:class:`SessionRow`, :class:`EventRow`, :class:`SnapshotRow`); the
store (``eventstore/store.py``) turns them into actions and states through the codec.

A call runs inside a transaction the caller opens::

    with storage.write() as tx:          # BEGIN IMMEDIATE on SQLite; row locks on PostgreSQL
        row = storage.lock_session(tx, "s1")
        storage.insert_events(tx, rows)
        storage.set_head(tx, row.pk, head, head_hash, head_turn)

``read()`` and ``write()`` are where driver exceptions become the error tree
(:mod:`eventstore.errors`): exactly one context manager does that, in ``sql/transactions.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from eventstore.core.rows import (
    CatalogueEffect,
    DIGEST_SIZE,
    Band,
    CompactionRow,
    Erasure,
    EventRow,
    FeedBarrier,
    FeedRow,
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

__all__ = ["Storage", "Tx", "EventIdRace", "ChangeWatcher", "AsyncChangeWatcher", "SegmentCoder"]

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

    def chain_end(self, prev: bytes, hashed_as: str, rows: Sequence[EventRow]) -> bytes:
        """The chain hash after ``rows`` recomputed from ``prev``."""
        ...

    def xact_digest(self, xacts: Sequence[int]) -> bytes:
        """The digest of feed numbers in version order (``event_segments.xact_digest``)."""
        ...


class Storage(ABC):
    """A database holding sessions, events and snapshots.

    Implementations: :class:`~eventstore.storage.sqlite.SQLiteStorage` and
    :class:`~eventstore.storage.postgres.PostgresStorage`, sharing their statements in
    :class:`~eventstore.storage.sql.SqlStorage`.
    """

    #: the SQLAlchemy dialect name ("sqlite" or "postgresql").
    dialect: str
    #: the URL with any password masked, for messages.
    safe_url: str

    # -- transactions -------------------------------------------------------------------

    @abstractmethod
    def read(self) -> AbstractContextManager[Tx]:
        """Open a read transaction (a consistent snapshot on both backends).

        Raises:
            SchemaError: the database is not migrated.
            StorageError: the database failed (``retryable`` set when a retry may work).
        """

    @abstractmethod
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

    @abstractmethod
    def close(self) -> None:
        """Release every connection (dispose the engine)."""

    # -- schema -------------------------------------------------------------------------

    @abstractmethod
    def migrate(self) -> None:
        """Upgrade the schema to the newest revision (idempotent; safe to run concurrently)."""

    @abstractmethod
    def schema_revision(self) -> str | None:
        """The applied revision, or ``None`` when the database has no eventstore schema."""

    # -- sessions -----------------------------------------------------------------------

    @abstractmethod
    def get_session(self, tx: Tx, session_id: str) -> SessionRow | None:
        """The session row with this id, or ``None``."""

    @abstractmethod
    def get_session_by_pk(self, tx: Tx, pk: int) -> SessionRow:
        """The session row with this surrogate key (it must exist)."""

    @abstractmethod
    def lock_session(self, tx: Tx, session_id: str) -> SessionRow | None:
        """Like :meth:`get_session`, holding the row lock until the transaction ends.

        This lock is what serialises appends to one session; other sessions are not blocked.
        """

    @abstractmethod
    def insert_session(self, tx: Tx, new: NewSession) -> SessionRow | None:
        """Insert a session row; ``None`` (and nothing written) when the id is taken."""

    @abstractmethod
    def set_head(self, tx: Tx, pk: int, head: int, head_hash: bytes, head_turn: int) -> None:
        """Move a session's head (the caller holds its lock)."""

    @abstractmethod
    def append_at(
        self,
        tx: Tx,
        session_pk: int,
        old_head: int,
        old_hash: bytes,
        rows: Sequence[EventRow],
        head_turn: int,
        effect: CatalogueEffect | None = None,
    ) -> bool:
        """Append ``rows`` only if the head is still ``(old_head, old_hash)``.

        The optimistic fast path of a writer that knows the head from its last append:
        the head check is part of the write (PostgreSQL: one statement, one round trip).
        The same statement applies ``effect`` to the session's catalogue columns
        (``None``: none).

        Returns:
            ``True`` when the rows were written and the head moved to the last row;
            ``False`` (nothing written) when the head had moved on.
        """

    @abstractmethod
    def append_fast(
        self,
        session_pk: int,
        old_head: int,
        old_hash: bytes,
        rows: Sequence[EventRow],
        head_turn: int,
        snapshots: Sequence[SnapshotRow],
        blobs: Mapping[bytes, bytes],
        effect: CatalogueEffect | None = None,
    ) -> bool:
        """:meth:`append_at` plus the snapshots it reaches, in a transaction of its own.

        PostgreSQL does it in one statement (one round trip, no BEGIN/COMMIT of its own).

        Returns:
            ``True`` when written and committed; ``False`` (nothing written) when the head
            had moved on.

        Raises:
            EventIdRace: an event id of ``rows`` is already recorded.
        """

    @abstractmethod
    def fetch_all(self, key: Any, stmt: Any, params: Mapping[str, Any]) -> list[Any]:
        """Every row of one read-only Core statement run on its own (one snapshot; on
        PostgreSQL in autocommit, compiled once per ``key``, the statement's shape)."""

    @abstractmethod
    def list_sessions(self, tx: Tx) -> list[SessionRow]:
        """Every session, oldest first."""

    @abstractmethod
    def max_child_fork(self, tx: Tx, pk: int) -> int | None:
        """The highest fork version of any branch made from this session, or ``None``."""

    # -- streaming turns: writer leases, closed sessions, group commit ------------------

    @abstractmethod
    def get_control(self, tx: Tx, pk: int, *, with_head_event: bool = False) -> SessionControl:
        """The lease and closed columns of a session (it must exist).

        ``with_head_event``: also read the type, payload and time of the event at the head
        when it is the session's own.
        """

    @abstractmethod
    def list_controls(self, tx: Tx) -> dict[int, SessionControl]:
        """:meth:`get_control` with the head event, for every session, by ``pk``."""

    @abstractmethod
    def set_writer(
        self, tx: Tx, pk: int, writer: str | None, seen_at: int | None, *, only_if: str | None = None
    ) -> bool:
        """Set (or, with ``None``, clear) a session's writer lease.

        Args:
            only_if: change it only while this token holds the lease.

        Returns:
            Whether the row changed.
        """

    @abstractmethod
    def close_session(self, tx: Tx, pk: int, closed_at: int, reason: str | None) -> None:
        """Mark a session closed to writes (the caller holds its lock)."""

    @abstractmethod
    def append_batches(self, batches: Sequence[TurnBatch]) -> list[bool]:
        """Write several sessions' batches in ONE transaction of its own (group commit).

        Each batch moves its session's head only if the head is still ``(old_head,
        old_hash)``, the turn still holds the lease and the session is not closed; then its
        rows and snapshots are inserted. A batch that fails its check writes nothing; the
        others are written all the same.

        Returns:
            For each batch, whether it was written.

        Raises:
            EventIdRace: an event id is already recorded (nothing was written).
            StorageError: the database failed (nothing was written, or — for a lost
                connection at commit — maybe everything: the caller's retry finds out).
        """

    # -- events -------------------------------------------------------------------------

    @abstractmethod
    def insert_events(self, tx: Tx, rows: Sequence[EventRow]) -> None:
        """Insert a batch of events in one round trip where the driver allows."""

    @abstractmethod
    def restore_events(self, tx: Tx, rows: Sequence[EventRow], *, before: int) -> bool:
        """Put back events of one session below its event at version ``before`` (an import
        undoing a compaction), at feed positions that keep the session in version order.

        ``rows``: one session's events, in version order, all below ``before`` and above
        every event of the session that is still there below ``before``. They take feed
        positions right before the event at ``before`` — not after every event committed
        since, as an insert would — so that a feed read from the start yields the session
        in version order, and a feed that has read past that event does not yield them
        (it had them before the compaction took them away). With no event at ``before``,
        they are inserted as any insert is (at the end of the feed).

        Returns:
            ``False`` when the rows cannot get such positions (SQLite, whose positions are
            row numbers: the free numbers between the session's neighbours ran out); then
            nothing was written.
        """

    @abstractmethod
    def events_by_id(self, tx: Tx, session_pk: int, event_ids: Sequence[str]) -> list[EventRow]:
        """The events of a session carrying any of these ids, in version order."""

    @abstractmethod
    def read_events(
        self,
        tx: Tx,
        session_pk: int,
        *,
        after: int,
        upto: int,
        limit: int | None = None,
        desc: bool = False,
    ) -> list[EventRow]:
        """Events with ``after < version <= upto`` of one session, in version order."""

    @abstractmethod
    def read_payloads(self, tx: Tx, session_pk: int, *, after: int, upto: int) -> list[bytes]:
        """Only the payloads of :meth:`read_events` (the fold's fast path)."""

    @abstractmethod
    def event_at(self, tx: Tx, session_pk: int, version: int) -> EventRow | None:
        """One event, or ``None`` when absent (never written, or compacted)."""

    # -- sealed segments ------------------------------------------------------------------

    def use_segments(self, coder: SegmentCoder) -> None:
        """Read and write sealed segments with ``coder`` (the engine calls it once)."""
        raise NotImplementedError

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
        raise NotImplementedError

    def sealable_turns(self, tx: Tx, session_pk: int | None, limit: int) -> list[SealableTurn]:
        """Up to ``limit`` turns whose events are still rows and that a later turn of the
        same session has closed (of one session, or of all), oldest session first."""
        raise NotImplementedError

    def lock_for_seal(self, tx: Tx, session_pk: int, *, wait: bool) -> SessionRow | None:
        """Lock a session's row against appends while its turns are sealed (``None``: the
        session is gone, or — without ``wait`` — another transaction holds it)."""
        raise NotImplementedError

    def seal_turn(self, tx: Tx, row: SessionRow, turn: SealableTurn, hashed_as: str) -> bool:
        """Rewrite one turn's rows into one segment and delete them, in ``tx``.

        Returns ``False`` (nothing written) when the rows are no longer all there, do not
        hash to their recorded chain under ``hashed_as``, or (PostgreSQL) are not yet below
        the feed's barrier; the turn is then tried again by a later call.
        """
        raise NotImplementedError

    # -- snapshots ----------------------------------------------------------------------

    @abstractmethod
    def latest_snapshot(
        self,
        tx: Tx,
        segments: Sequence[Segment],
        reducer_version: int,
        baselines: Sequence[tuple[int, int]] = (),
    ) -> SnapshotRow | None:
        """The newest snapshot inside the segments made by ``reducer_version``.

        A snapshot at a compaction baseline ``(session_pk, version)`` of ``baselines`` is
        served whatever its reducer version: the events it stands for are gone.
        """

    @abstractmethod
    def list_snapshots(
        self, tx: Tx, session_pk: int, *, after: int, upto: int
    ) -> list[SnapshotRow]:
        """The snapshots of one session with ``after < version <= upto``."""

    @abstractmethod
    def put_snapshot(self, tx: Tx, snap: SnapshotRow, blobs: Mapping[bytes, bytes]) -> None:
        """Store a snapshot (replacing one at the same version) and the blobs it adds.

        Blobs already present are left alone (content-addressed).
        """

    @abstractmethod
    def get_blobs(self, tx: Tx, digests: Sequence[bytes]) -> dict[bytes, bytes]:
        """The bodies of these digests (missing ones are absent from the result)."""

    def ordered_bodies(self, tx: Tx, message_digests: bytes) -> list[bytes | None]:
        """The bodies of a snapshot's concatenated digests, in their order (``None``: missing)."""
        n = DIGEST_SIZE
        digests = [message_digests[i : i + n] for i in range(0, len(message_digests), n)]
        bodies = self.get_blobs(tx, digests)
        return [bodies.get(d) for d in digests]

    def load_parts(
        self, session_id: str, version: int | None, reducer_version: int
    ) -> LoadParts | None:
        """A root session's state parts at ``version`` (``None``: the head), in one read.

        The newest usable snapshot at or below the version (as :meth:`latest_snapshot`
        with the session's compaction baseline), its stored blobs in order and the
        payloads of the events after it. ``None`` when the backend has no such
        statement (the store then reads the parts one by one).
        """
        return None

    # -- compaction ---------------------------------------------------------------------

    @abstractmethod
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

        The caller has already stored the baseline snapshot at ``upto`` in the same
        transaction. Deletes the session's events with ``keep_upto < version <= upto``
        (branches need the events at or below their fork versions, ``keep_upto``) and its
        snapshots with ``keep_upto < version < upto``, under a compaction permit that the
        database's immutability trigger checks and that is gone again before commit.

        Returns:
            the number of events deleted.
        """

    # -- audit: compaction records, erasure, blob collection ------------------------------

    @abstractmethod
    def record_compaction(
        self,
        tx: Tx,
        session_pk: int,
        *,
        upto: int,
        state_digest: bytes,
        compacted_at: int,
        actor: str | None = None,
    ) -> CompactionRow:
        """Write the compaction record binding baseline ``upto`` to the chain.

        Call it in the compaction's transaction, *before* :meth:`compact` deletes the
        events: it reads the chain hashes of the session's own versions from its current
        baseline (exclusive) to ``upto`` and keeps them, with the hash and turn at ``upto``
        and the baseline state's digest.

        Raises:
            StorageError: the session's events up to ``upto`` are not all there, or a
                record for this ``upto`` exists.
        """

    @abstractmethod
    def insert_compaction(self, tx: Tx, rec: CompactionRow) -> None:
        """Write a compaction record as given (an import of a compacted session, whose
        removed versions never were in this database: ``removed_hashes`` may be empty).

        Raises:
            StorageError: a record for this session and ``upto`` exists.
        """

    @abstractmethod
    def list_compactions(self, tx: Tx, session_pk: int) -> list[CompactionRow]:
        """The compaction records of one session, oldest (lowest ``upto``) first."""

    @abstractmethod
    def recorded_hash(self, tx: Tx, session_pk: int, version: int) -> bytes | None:
        """The chain hash the database holds for a version of this session's own events.

        The event row's hash when the row is there; otherwise the hash a compaction
        recorded for it; ``None`` when neither (a version at or below a branch's fork
        lives in the parent: ask the parent).
        """

    @abstractmethod
    def descendants(self, tx: Tx, pk: int) -> list[SessionRow]:
        """Every branch forked from this session, transitively, parents before children."""

    @abstractmethod
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
        again before returning), snapshots, compaction records and session rows, and
        writes the tombstones. The caller holds the session's lock. Only the schema
        owner (or a role granted the same) can: the application role is refused.

        Raises:
            StorageError: permission denied, or a tombstone for one of the ids exists.
        """

    @abstractmethod
    def get_tombstone(self, tx: Tx, session_id: str) -> TombstoneRow | None:
        """The tombstone of an erased session, or ``None``."""

    @abstractmethod
    def list_tombstones(self, tx: Tx) -> list[TombstoneRow]:
        """Every tombstone, ordered by session id."""

    @abstractmethod
    def rewind_session(self, tx: Tx, rec: RewindRow, new: NewSession, closed_at: int, reason: str) -> SessionRow:
        """Keep a session's line under another id and give its id a new row (a rewind).

        Row ``rec.kept_pk`` is renamed to ``rec.kept_id``, closed to writes (``reason``)
        and marked as a line of the new row; ``new`` (the session id, a branch of the
        kept row) is inserted; the audit record ``rec`` (its ``new_pk`` filled in) is
        written. No event row is touched. The caller holds the session's lock.

        Returns:
            The new row.

        Raises:
            StorageError: the role may not, or an id is taken.
        """

    @abstractmethod
    def restore_rewind(self, tx: Tx, rec: RewindRow, closed_at: int, reason: str) -> None:
        """Write back a rewind an export carried (an import): row ``rec.kept_pk``, already
        named ``rec.kept_id`` and holding the kept line, is closed to writes (``reason``)
        and marked as a line of row ``rec.new_pk``; the audit record ``rec`` is written.
        No event row is touched.

        Raises:
            StorageError: the role may not, or the record's kept id is taken.
        """

    @abstractmethod
    def list_rewinds(
        self, tx: Tx, *, session_id: str | None = None, pks: Collection[int] | None = None
    ) -> list[RewindRow]:
        """Rewind records, oldest first: of one rewound id, or whose kept or new row is
        one of ``pks``, or (neither given) every one."""

    @abstractmethod
    def collect_blobs(self, tx: Tx, candidates: Iterable[bytes] | None = None) -> int:
        """Delete snapshot blobs that no snapshot references; the number deleted.

        Args:
            candidates: only these digests are considered (what an erasure or a
                compaction released); ``None`` considers every blob.

        Blocks concurrent snapshot writes until the transaction ends (PostgreSQL: an
        EXCLUSIVE lock on ``snapshots`` and ``snapshot_blobs``; SQLite: the write lock),
        so no snapshot can start referencing a blob while it is being deleted.
        """

    # -- feed -----------------------------------------------------------------------------

    #: The feed reads bands of ``xact`` (``upto`` of :meth:`read_feed`) because its index
    #: cannot return rows in feed order (PostgreSQL's BRIN index); see eventstore/core/feed_rules.py.
    feed_banded: bool = False

    @abstractmethod
    def feed_barrier(self, tx: Tx) -> FeedBarrier:
        """How far the feed may read now (see :class:`FeedBarrier`)."""

    @abstractmethod
    def read_feed(
        self, tx: Tx, *, after: tuple[int, int, int] | None, limit: int
    ) -> list[FeedRow]:
        """Events in feed order after the key ``(xact, session_pk, version)`` of a storage
        whose every committed event is final (not :attr:`feed_banded`: SQLite).

        Args:
            after: the key of the last event read (``None``: from the start).
            limit: at most this many rows.
        """

    def read_band(self, *, after: tuple[int, int, int] | None, limit: int, upto: int) -> Band:
        """One band of a :attr:`feed_banded` storage, in a read transaction of its own: the
        barrier ``below`` (as :attr:`FeedBarrier.below`), in feed order after the key
        ``after`` at most ``limit`` events with ``xact <= min(upto, below - 1)`` — final
        events: no event can ever be added before them —, and whether committed events
        wait at or above the barrier. Barrier, rows and that check are read by one
        statement, in one snapshot; the call returns once the transaction has ended.
        """
        raise NotImplementedError

    @abstractmethod
    def watcher(self) -> ChangeWatcher:
        """The storage's change watcher (one per storage, started on first use; its
        dedicated connection is released by :meth:`close`)."""

    def others_committed(self) -> None:
        """A change watcher reported commits by other writers: the next read must see them.

        A no-op on one server; a storage that reads from replicas reads them from one that
        has replayed them (or from the primary).
        """

    @abstractmethod
    def async_watcher(self) -> AsyncChangeWatcher:
        """The change watcher of a storage opened for asyncio (one per storage, a task on
        its event loop, started on first use; released by :meth:`close`)."""

    def iter_chunks(self, seq: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
        """Split a long parameter list (SQLite caps bound parameters per statement)."""
        for i in range(0, len(seq), size):
            yield seq[i : i + size]
