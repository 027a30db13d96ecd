"""The engine's steps inside a caller's transaction: rows, lineage, states, locked writes.

:class:`TransactionSteps` is the half of :class:`~eventstore.engine.engine.Engine` whose
methods take an open transaction (``tx``) and never open one: the engine's own operations
compose them, and so do the feature modules (import, verify, audit, rewind), which run
several of them in one transaction the engine opens (:meth:`Engine.reading
<eventstore.engine.engine.Engine.reading>`, :meth:`Engine.writing
<eventstore.engine.engine.Engine.writing>`). The single reads and writes of rows they are made
of are :class:`~eventstore.engine.row_steps.RowSteps`'. Nothing here commits; every write
waits for the caller's write transaction to end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from eventstore.core.appends import (
    State,
    baselines,
    check_tail,
    event_rows,
    fold_tail,
    known_hash_turn,
    missing_blob,
    segments,
)
from eventstore.core.catalogue import (
    absolute_effect,
    catalogue_after,
    catalogue_fields,
    first_user_text,
    rest_status,
    state_catalogue,
)
from eventstore.core.catalogue import effect as catalogue_effect
from eventstore.core.codec import DIGEST_SIZE, SnapshotCodec, decode_many
from eventstore.core.ids import check_new_session_id
from eventstore.core.records import SessionInfo, to_datetime
from eventstore.core.reducer import REDUCER_VERSION, fold_json
from eventstore.core.rewinds import Rewinds
from eventstore.core.rows import (
    CompactionRow,
    EventRow,
    NewSession,
    SessionControl,
    SessionRow,
    SnapshotRow,
    TombstoneRow,
)
from eventstore.core.turn_rules import session_info
from eventstore.core.validation import Validator
from eventstore.engine.planner import AppendPlan, AppendPlanner
from eventstore.engine.row_steps import RowSteps
from eventstore.errors import (
    CompactedError,
    ConcurrencyError,
    SessionClosed,
    SessionErased,
    SessionNotFound,
    StorageError,
)
from eventstore.storage import Storage
from eventstore.storage import catalogue as catalogue_rows
from eventstore.storage.interface import Tx

__all__ = ["TransactionSteps", "now_micros"]


def now_micros() -> int:
    """Microseconds since the Unix epoch, now (the one clock of the engine)."""
    return time.time_ns() // 1000


class TransactionSteps(RowSteps):
    """The engine's steps over an open transaction (see the module docstring); the
    single reads and writes they are made of are :class:`RowSteps`'.

    Attributes:
        storage: the database (rows of ids, integers and bytes).
        validate: the argument validator every entry point uses.
        planner: snapshot planning and the per-process caches.
    """

    storage: Storage
    validate: Validator
    planner: AppendPlanner

    # -- rows and lineage -----------------------------------------------------------------

    def row(self, tx: Tx, session: Any) -> SessionRow:
        """The row of a session (its id validated first).

        Raises:
            InvalidEvent: the id is not valid.
            SessionNotFound: there is no such session.
        """
        self.validate.id(session, "session")
        row = self.find_row(tx, session)
        if row is None:
            raise self.missing(tx, session)
        return row

    def missing(self, tx: Tx, session: str) -> SessionNotFound | SessionErased:
        """The error for a session id with no row: :class:`SessionErased` when a tombstone
        says it was erased, else :class:`SessionNotFound`."""
        mark = self.tombstone(tx, session)
        if mark is None:
            return SessionNotFound(session)
        return SessionErased(session, erased_at=mark.erased_at, actor=mark.actor, reason=mark.reason)

    def insert_new_session(self, tx: Tx, new: NewSession) -> SessionRow | None:
        """Insert a session row; ``None`` when the id is taken.

        Raises:
            SessionErased: the id belonged to an erased session (ids are never reused, so a
                tombstone always names one session's history).
        """
        if self.tombstone(tx, new.id) is not None:
            raise self.missing(tx, new.id)
        return self.storage.insert_session(tx, new)

    def session_by_pk(self, tx: Tx, pk: int) -> SessionRow:
        """The session row with this key, which must exist (a key read from another row).

        Raises:
            StorageError: the row is gone (the database was edited behind the library).
        """
        row = self.storage.session(tx, pk=pk)
        if row is None:
            raise StorageError(f"session row {pk} vanished; run `eventstore verify`")
        return row

    def event_at(self, tx: Tx, pk: int, version: int) -> EventRow | None:
        """One event of session row ``pk``, or ``None`` when absent (never written, or compacted)."""
        found = self.events(tx, pk, after=version - 1, upto=version)
        return found[0] if found else None

    def tombstone(self, tx: Tx, session: str) -> TombstoneRow | None:
        """The tombstone of an erased session id, or ``None``."""
        found = self.storage.records(tx, TombstoneRow, session_id=session)
        return found[0] if found else None

    def lineage(self, tx: Tx, row: SessionRow) -> list[SessionRow]:
        """``row`` and the sessions it descends from, root first."""
        chain = [row]
        while chain[-1].parent_pk is not None:
            chain.append(self.session_by_pk(tx, chain[-1].parent_pk))
        chain.reverse()
        return chain

    def hash_turn_at(self, tx: Tx, row: SessionRow, version: int) -> tuple[bytes, int]:
        """The chain hash and turn number at a version of a session's lineage.

        Raises:
            CompactedError: the event at that version is gone.
        """
        known = known_hash_turn(row, version)
        if known is not None:
            return known
        lineage = self.lineage(tx, row)
        for seg in segments(lineage, version):
            if seg.after < version <= seg.upto:
                e = self.event_at(tx, seg.session_pk, version)
                if e is not None:
                    return e.hash, e.turn
                owner = next(r for r in lineage if r.pk == seg.session_pk)
                if owner.baseline == version and owner.baseline_hash is not None:
                    return owner.baseline_hash, owner.baseline_turn
        raise CompactedError(row.id, version, row.baseline, row.head)

    def event_names(self, tx: Tx, lineage: Sequence[SessionRow]) -> dict[int, str]:
        """The id each row of a lineage reports its events under: the id of the session
        they were appended to (a kept line's events: the id that was rewound)."""
        names = {r.pk: r.id for r in lineage}
        return Rewinds(self.rewinds(tx, pks=names.keys())).event_names(names)

    # -- states ---------------------------------------------------------------------------

    def state_at(self, tx: Tx, row: SessionRow, version: int) -> State:
        """The state dict after ``version`` (already checked against ``row``)."""
        if version == 0:
            return fold_json(None, ())
        snap, payloads = self.snapshot_and_tail(tx, row, version)
        if snap is None:
            return fold_tail(row.id, 0, version, None, decode_many(payloads))
        state = self.decode_snapshot(tx, snap)
        return fold_tail(row.id, snap.version, version, state, decode_many(payloads))

    def snapshot_and_tail(
        self, tx: Tx, row: SessionRow, version: int
    ) -> tuple[SnapshotRow | None, list[bytes]]:
        """The newest snapshot of ``row``'s lineage usable at ``version`` (``None``: fold
        from the start) and the payloads of the events after it, up to ``version``."""
        st = self.storage
        lineage = self.lineage(tx, row) if row.parent_pk is not None else [row]
        segs = segments(lineage, version)
        usable = st.snapshots(tx, segs, usable_by=REDUCER_VERSION, baselines=baselines(lineage, version))
        snap = usable[0] if usable else None
        base = 0 if snap is None else snap.version
        payloads: list[bytes] = []
        for seg in segs:
            if seg.upto > base:
                payloads += st.read_events(tx, seg.session_pk, after=max(seg.after, base), upto=seg.upto, payloads=True)
        return snap, payloads

    def decode_snapshot(self, tx: Tx, snap: SnapshotRow) -> State:
        """The state a snapshot row stands for."""
        ordered = self.storage.ordered_bodies(tx, snap.message_digests)
        if None in ordered:
            raise missing_blob(snap.version)
        return self.planner.codec.load(snap.rest, ordered)  # type: ignore[arg-type]

    def put_snapshot(self, tx: Tx, pk: int, version: int, state: Mapping[str, Any], written: set[bytes]) -> None:
        """Store ``state`` as the snapshot of session ``pk`` at ``version``; add the blobs
        written to ``written``, so that later snapshots of the same transaction skip them."""
        snap, fresh = self.planner.snapshot(pk, version, state)
        fresh = {d: body for d, body in fresh.items() if d not in written}
        self.storage.put_snapshot(tx, snap, fresh)
        written.update(fresh)

    # -- writes under the session's lock --------------------------------------------------

    def lock_for_append(self, tx: Tx, session: str, expected: int | None = None) -> SessionRow:
        """Lock a session's row for an append, creating the session if it is new.

        Raises:
            ConcurrencyError: the session is new and ``expected`` is neither ``None`` nor 0.
        """
        row = self.find_row(tx, session, lock=True)
        if row is None:
            if expected not in (None, 0):
                raise ConcurrencyError(session, expected, 0)
            check_new_session_id(session)
            row = self.insert_new_session(tx, NewSession(id=session, created_at=now_micros()))
            if row is None:  # created concurrently: wait for its lock
                row = self.find_row(tx, session, lock=True)
                assert row is not None
        return row

    def check_open(self, tx: Tx, row: SessionRow) -> SessionControl:
        """The session's control row, once it is known not to be closed.

        Raises:
            SessionClosed: the session was closed to writes.
        """
        control = self.control(tx, row.pk)
        if control.closed_at is not None:
            raise SessionClosed(row.id, control.closed_reason)
        return control

    def write_locked(
        self,
        tx: Tx,
        row: SessionRow,
        action_dicts: list[dict[str, Any]],
        encoded: list[tuple[str, bytes]],
        ids: Sequence[str] | None,
        actor: str | None,
        meta: bytes | None,
        now: int,
        natives: Sequence[bytes | None] | None = None,
    ) -> tuple[list[EventRow], bytes, int, AppendPlan]:
        """Write a batch after the head of a locked row: events, head, due snapshots.

        Returns:
            ``(rows, new head hash, new head turn, plan)``; after the commit, pass the
            new head row and the plan to ``planner.committed``.
        """
        st = self.storage
        planner = self.planner
        rows, prev, turn = event_rows(row, row.id, encoded, ids, actor, meta, now, natives)
        head = rows[-1].version
        self.write_events(tx, rows)
        self.move_head(tx, row.pk, head, prev, turn)
        catalogue_rows.apply_effect(tx, row.pk, catalogue_effect(action_dicts, now))
        plan = planner.plan(row, action_dicts, head)
        if plan is None:
            # Re-read the row: a compaction elsewhere may have moved its baseline.
            fresh = self.find_row(tx, row.id) or row
            plan = planner.plan(row, action_dicts, head, self.state_at(tx, fresh, row.head))
            assert plan is not None
        for snap in plan.snapshots:
            st.put_snapshot(tx, snap, plan.blobs if snap is plan.snapshots[0] else {})
        return rows, prev, turn, plan

    # -- catalogue columns and listings ---------------------------------------------------

    def catalogue_at(self, tx: Tx, row: SessionRow, version: int) -> dict[str, Any]:
        """The catalogue's ``status`` and ``first_text`` of a session at a version (for a
        row that starts there: a branch, a rewound head)."""
        if version == row.head:
            own = catalogue_rows.rows_by_pk(tx, [row.pk]).get(row.pk)
            if own is not None:
                return {"status": own.status, "first_text": own.first_text}
        status, first_text = "idle", None
        if version == 0:
            return {"status": status, "first_text": first_text}
        # Not a fold of the state at ``version`` (which decodes every message): the columns
        # at the nearest snapshot (its rest, its first user message), then the write path's
        # rule over the events after it. The cost is the snapshot interval, not the session.
        snap, payloads = self.snapshot_and_tail(tx, row, version)
        base = 0
        if snap is not None:
            base = snap.version
            status = rest_status(orjson.loads(snap.rest))
            first_text = first_user_text(self.snapshot_messages(tx, snap))
        check_tail(row.id, base, version, len(payloads))
        status, first_text = catalogue_after(status, first_text, decode_many(payloads))
        return {"status": status, "first_text": first_text}

    def snapshot_messages(self, tx: Tx, snap: SnapshotRow) -> Iterator[dict[str, Any]]:
        """A snapshot's messages in order, each body read when it is reached (a reader
        that stops at the first user message reads one or two, not all of them)."""
        digests = snap.message_digests
        start, chunk = 0, 1
        while start < len(digests):
            end = min(len(digests), start + chunk * DIGEST_SIZE)
            bodies = self.storage.ordered_bodies(tx, digests[start:end])
            if None in bodies:
                raise missing_blob(snap.version)
            yield from SnapshotCodec.messages(bodies)  # type: ignore[arg-type]
            start, chunk = end, chunk * 8

    def refresh_catalogue(self, tx: Tx, pk: int) -> None:
        """Set a session's catalogue columns from its state at its head (after a write that
        moved the head without knowing the batch: an import)."""
        row = self.session_by_pk(tx, pk)
        status, first_text = state_catalogue(self.state_at(tx, row, row.head))
        updated = row.created_at
        if row.head > (row.fork_version or 0):
            ev = self.event_at(tx, row.pk, row.head)
            if ev is not None:
                updated = ev.recorded_at
        catalogue_rows.apply_effect(tx, pk, absolute_effect(status, first_text, updated))

    def carry_catalogue(self, tx: Tx, from_pk: int, to_pk: int, updated_at: int) -> None:
        """The session id moved from row ``from_pk`` to ``to_pk`` (a rewind): the new row keeps
        the conversation's title, owner and metadata, and its last activity is ``updated_at``."""
        catalogue_rows.carry_info(tx, from_pk, to_pk, updated_at)

    def infos(
        self,
        tx: Tx,
        rows: Sequence[SessionRow],
        known: Mapping[int, SessionRow],
        controls: Mapping[int, SessionControl],
        rewinds: Rewinds,
    ) -> list[SessionInfo]:
        """The :class:`SessionInfo` of each row (``known``: rows by pk, for naming parents;
        a rewind's rows are reported as :class:`eventstore.core.rewinds.Rewinds` says),
        with its catalogue fields."""
        catalogue = catalogue_rows.rows_by_pk(tx, [r.pk for r in rows])
        out = []
        for r in rows:
            parent, fork = rewinds.parent(r, known)
            out.append(
                session_info(
                    controls.get(r.pk),
                    id=r.id,
                    parent=parent,
                    fork_version=fork,
                    head=r.head,
                    baseline=r.baseline,
                    created_at=to_datetime(r.created_at),
                    head_turn=r.head_turn,
                    **catalogue_fields(catalogue.get(r.pk)),
                )
            )
        return out

    # -- branch and compaction rows -------------------------------------------------------

    def fork_of(self, tx: Tx, row: SessionRow, fork: int, new_id: str, created_at: int) -> NewSession:
        """The row of a branch of ``row`` at version ``fork`` (already checked)."""
        h, turn = self.hash_turn_at(tx, row, fork)
        return NewSession(
            id=new_id,
            created_at=created_at,
            parent_pk=row.pk,
            fork_version=fork,
            head=fork,
            head_hash=h,
            head_turn=turn,
            # What the parent compacted away is gone for the branch too.
            baseline=row.baseline,
            baseline_hash=row.baseline_hash,
            baseline_turn=row.baseline_turn,
            **self.catalogue_at(tx, row, fork),
        )

    def record_compaction(
        self, tx: Tx, row: SessionRow, upto: int, h: bytes, turn: int, digest: bytes, actor: str | None
    ) -> None:
        """Write the compaction record of moving ``row``'s baseline to ``upto``.

        A branch whose new baseline is at or below its fork point removes none of its own
        events: its record keeps no hashes, only the baseline's hash, turn and state digest.
        """
        now = now_micros()
        if upto > (row.fork_version or 0):
            self.write_compaction(tx, self.removed_record(tx, row, upto, digest, now, actor))
            return
        self.write_compaction(
            tx,
            CompactionRow(
                session_pk=row.pk,
                upto=upto,
                previous_baseline=row.baseline,
                baseline_hash=h,
                baseline_turn=turn,
                state_digest=digest,
                first_version=upto + 1,
                removed_hashes=b"",
                compacted_at=now,
                actor=actor,
            ),
        )

    def removed_record(
        self, tx: Tx, row: SessionRow, upto: int, digest: bytes, now: int, actor: str | None
    ) -> CompactionRow:
        """The compaction record binding baseline ``upto`` to the chain, read *before* the
        compaction deletes the events: the chain hashes of the session's own versions from
        its current baseline (exclusive) to ``upto``, the hash and turn at ``upto`` and the
        baseline state's digest.

        Raises:
            StorageError: the session's events up to ``upto`` are not all there.
        """
        first = max(row.baseline, row.fork_version or 0) + 1
        found = [
            (e.version, e.hash, e.turn)
            for e in self.events(tx, row.pk, after=first - 1, upto=upto)
        ]
        if upto < first or [r[0] for r in found] != list(range(first, upto + 1)):
            raise StorageError(
                f"cannot record a compaction of session {row.id!r} up to {upto}: its events "
                f"{first}..{upto} are not all there"
            )
        return CompactionRow(
            session_pk=row.pk,
            upto=upto,
            previous_baseline=row.baseline,
            baseline_hash=bytes(found[-1][1]),
            baseline_turn=int(found[-1][2]),
            state_digest=bytes(digest),
            first_version=first,
            removed_hashes=b"".join(bytes(r[1]) for r in found),
            compacted_at=now,
            actor=actor,
        )
