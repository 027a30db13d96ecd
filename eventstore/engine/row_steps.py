"""The log's rows and audit records, read and written in a caller's transaction.

:class:`RowSteps` is the base of :class:`~eventstore.engine.transaction_steps.TransactionSteps`:
each method is one read or write of session rows, events, heads and baselines, or of the
audit records (compactions, rewinds, tombstones), named for what it is to the log rather
than for the statement that does it. The feature modules compose them inside a
transaction the engine opens (:meth:`Engine.reading <eventstore.engine.engine.Engine.reading>`,
:meth:`Engine.writing <eventstore.engine.engine.Engine.writing>`); they never reach
storage themselves. Nothing here commits or opens a transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from eventstore.core.rows import (
    CompactionRow,
    EventRow,
    NewSession,
    RewindRow,
    Segment,
    SessionControl,
    SessionRow,
    SnapshotRow,
    TombstoneRow,
)
from eventstore.core.validation import MAX_VERSION
from eventstore.storage import Storage
from eventstore.storage.interface import Tx

__all__ = ["RowSteps"]


class RowSteps:
    """Single reads and writes of the log's rows inside a caller's transaction.

    Attributes:
        storage: the database (rows of ids, integers and bytes).
    """

    storage: Storage

    # -- session rows ---------------------------------------------------------------------

    def find_row(self, tx: Tx, session: str, *, lock: bool = False) -> SessionRow | None:
        """The row of a session id, or ``None``; ``lock``: hold its lock until the
        transaction ends (what serialises writes to one session)."""
        return self.storage.session(tx, id=session, lock=lock)

    def all_rows(self, tx: Tx) -> list[SessionRow]:
        """Every session row, oldest first."""
        return self.storage.sessions(tx)

    def branches(self, tx: Tx, row: SessionRow) -> list[SessionRow]:
        """Every branch forked from ``row``, transitively, parents before children."""
        return self.storage.sessions(tx, descendants_of=row.pk)

    def control(self, tx: Tx, pk: int, *, with_head_event: bool = False) -> SessionControl:
        """The lease and closed columns of session row ``pk`` (``with_head_event``: also
        the type, payload and time of its own head event)."""
        return self.storage.controls(tx, pk, with_head_event=with_head_event)[pk]

    def move_head(self, tx: Tx, pk: int, version: int, head_hash: bytes, turn: int) -> None:
        """Make ``version`` (its chain hash, its turn) the head of locked session row ``pk``."""
        self.storage.update_session(tx, pk, head=(version, head_hash, turn))

    # -- events and snapshots -------------------------------------------------------------

    def events(
        self, tx: Tx, pk: int, *, after: int, upto: int = MAX_VERSION, limit: int | None = None
    ) -> list[EventRow]:
        """Session row ``pk``'s own events with ``after < version <= upto`` in version
        order (at most ``limit``), rows and sealed segments alike."""
        return self.storage.read_events(tx, pk, after=after, upto=upto, limit=limit)

    def write_events(self, tx: Tx, rows: Sequence[EventRow], *, before: int | None = None) -> bool:
        """Write events as they are (an import); ``before``: put them back in the feed
        right before the session's event at that version (``False``, nothing written,
        when that order cannot be kept; see :meth:`Storage.insert_events
        <eventstore.storage.interface.Storage.insert_events>`)."""
        return self.storage.insert_events(tx, rows, before=before)

    def recorded_hash(self, tx: Tx, pk: int, version: int) -> bytes | None:
        """The chain hash held for a version of session row ``pk``'s own events: its event
        row's, else the one a compaction recorded, else ``None``."""
        return self.storage.recorded_hash(tx, pk, version)

    def sealed_id_mismatches(self, tx: Tx, pk: int) -> list[tuple[int, str | None, str | None]]:
        """Where session row ``pk``'s sealed event ids disagree with its sealed events:
        ``(version, id held, id named)`` (an edit made behind the library's back)."""
        return self.storage.sealed_id_mismatches(tx, pk)

    def stored_snapshots(self, tx: Tx, seg: Segment) -> list[SnapshotRow]:
        """Every snapshot stored inside a segment, whatever reducer made it, in version order."""
        return self.storage.snapshots(tx, [seg])

    # -- audit records: compactions, rewinds, erasures ------------------------------------

    def compactions(self, tx: Tx, pk: int) -> list[CompactionRow]:
        """The compaction records of session row ``pk``, lowest ``upto`` first."""
        return self.storage.records(tx, CompactionRow, session_pk=pk)

    def write_compaction(self, tx: Tx, rec: CompactionRow) -> None:
        """Write a compaction record as given (the caller moves the baseline)."""
        self.storage.insert_compaction(tx, rec)

    def move_baseline(
        self, tx: Tx, pk: int, *, upto: int, keep_upto: int, baseline_hash: bytes, baseline_turn: int
    ) -> int:
        """Make ``upto`` session row ``pk``'s baseline and delete the events above
        ``keep_upto`` it replaces (its snapshot and record are written already); how many
        were deleted."""
        return self.storage.compact(
            tx, pk, upto=upto, keep_upto=keep_upto, baseline_hash=baseline_hash, baseline_turn=baseline_turn
        )

    def rewinds(
        self, tx: Tx, *, session_id: str | None = None, pks: Collection[int] | None = None
    ) -> list[RewindRow]:
        """The rewind records, oldest first: of one rewound ``session_id``, or whose kept or
        new row is one of ``pks``, or (neither given) every one."""
        return self.storage.records(tx, RewindRow, session_id=session_id, pks=pks)

    def record_rewind(
        self, tx: Tx, rec: RewindRow, *, closed_at: int, reason: str, new: NewSession | None = None
    ) -> SessionRow | None:
        """Keep a locked session's line under ``rec.kept_id``, closed, and give its id the
        row ``new`` (a rewind; the new row returned); without ``new``, write back a rewind
        an export carried."""
        return self.storage.rewind_session(tx, rec, closed_at=closed_at, reason=reason, new=new)

    def tombstones(self, tx: Tx) -> list[TombstoneRow]:
        """Every erased session's tombstone."""
        return self.storage.records(tx, TombstoneRow)

    def erase_family(self, tx: Tx, pk: int, *, erased_at: int, actor: str | None, reason: str) -> list[str]:
        """Erase locked session row ``pk`` and its branches, leaving tombstones, and delete
        the snapshot blobs they alone used; the erased ids, the session first."""
        done = self.storage.erase_session(tx, pk, erased_at=erased_at, actor=actor, reason=reason)
        return [t.session_id for t in done.tombstones]
