"""Compaction and erasure: events deleted under permits, their audit records, tombstones, unused blobs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from sqlalchemy import delete, insert, select, update

from eventstore.core.rows import DIGEST_SIZE, CompactionRow, Erasure, SessionRow, TombstoneRow
from eventstore.errors import StorageError
from eventstore.storage.catalogue import forget as forget_info
from eventstore.storage.interface import Tx
from eventstore.storage.schema import (
    compaction_permits,
    compactions,
    events,
    sessions,
    snapshot_blobs,
    snapshots,
    tombstones,
)
from eventstore.storage.sql.statements import CHUNK, SESSION_COLS, session_row
from eventstore.storage.sql.transactions import SqlTransactions

__all__ = ["Compaction"]

# An erasure's permit covers every version a session can have (versions are int4).
_ALL_VERSIONS = 2**31 - 1


class Compaction(SqlTransactions):
    """The operations that delete history: compaction, erasure and blob collection."""

    # -- compaction ---------------------------------------------------------------------

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
        tx.execute(
            update(sessions)
            .where(sessions.c.pk == session_pk)
            .values(baseline=upto, baseline_hash=baseline_hash, baseline_turn=baseline_turn)
        )
        # The permit is what the DELETE trigger checks; it never outlives this transaction.
        tx.execute(insert(compaction_permits).values(session_pk=session_pk, upto=upto))
        deleted = tx.execute(
            delete(events).where(
                events.c.session_pk == session_pk,
                events.c.version > keep_upto,
                events.c.version <= upto,
            )
        ).rowcount
        tx.execute(
            delete(snapshots).where(
                snapshots.c.session_pk == session_pk,
                snapshots.c.version > keep_upto,
                snapshots.c.version < upto,
            )
        )
        tx.execute(delete(compaction_permits).where(compaction_permits.c.session_pk == session_pk))
        return int(deleted or 0) + self._cut_segments(tx, session_pk, after=keep_upto, upto=upto)

    # -- audit: compaction records, erasure, blob collection ------------------------------

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
        row = self.get_session_by_pk(tx, session_pk)
        first = max(row.baseline, row.fork_version or 0) + 1
        found = [
            (e.version, e.hash, e.turn)
            for e in self.read_events(tx, session_pk, after=first - 1, upto=upto)
        ]
        if upto < first or [r[0] for r in found] != list(range(first, upto + 1)):
            raise StorageError(
                f"cannot record a compaction of session {row.id!r} up to {upto}: its events "
                f"{first}..{upto} are not all there"
            )
        rec = CompactionRow(
            session_pk=session_pk,
            upto=upto,
            previous_baseline=row.baseline,
            baseline_hash=bytes(found[-1][1]),
            baseline_turn=int(found[-1][2]),
            state_digest=bytes(state_digest),
            first_version=first,
            removed_hashes=b"".join(bytes(r[1]) for r in found),
            compacted_at=compacted_at,
            actor=actor,
        )
        self.insert_compaction(tx, rec)
        return rec

    def insert_compaction(self, tx: Tx, rec: CompactionRow) -> None:
        tx.execute(insert(compactions).values(**_fields(rec)))

    def list_compactions(self, tx: Tx, session_pk: int) -> list[CompactionRow]:
        rows = tx.execute(
            select(*compactions.c)
            .where(compactions.c.session_pk == session_pk)
            .order_by(compactions.c.upto)
        ).mappings()
        return [_compaction(r) for r in rows]

    def recorded_hash(self, tx: Tx, session_pk: int, version: int) -> bytes | None:
        ev = self.event_at(tx, session_pk, version)
        if ev is not None:
            return ev.hash
        for rec in self.list_compactions(tx, session_pk):
            h = rec.hash_at(version)
            if h is not None:
                return h
        return None

    def descendants(self, tx: Tx, pk: int) -> list[SessionRow]:
        out: list[SessionRow] = []
        frontier = [pk]
        while frontier:
            children: list[SessionRow] = []
            for chunk in self.iter_chunks(frontier, CHUNK):
                rows = tx.execute(
                    select(*SESSION_COLS)
                    .where(sessions.c.parent_pk.in_(list(chunk)))
                    .order_by(sessions.c.pk)
                ).all()
                children.extend(session_row(r) for r in rows)
            out.extend(children)
            frontier = [c.pk for c in children]
        return out

    def erase_session(
        self,
        tx: Tx,
        session_pk: int,
        *,
        erased_at: int,
        actor: str | None,
        reason: str,
    ) -> Erasure:
        root = self.get_session_by_pk(tx, session_pk)
        family = [root, *self.descendants(tx, session_pk)]
        # Session rows first, in key order, as appends, compaction and the sealer take
        # them: deleting events before holding the rows deadlocks with a sealer that
        # holds a row and then deletes that session's events.
        tx.execute(
            self._lock_clause(
                select(sessions.c.pk)
                .where(sessions.c.pk.in_([r.pk for r in family]))
                .order_by(sessions.c.pk)
            )
        )
        marks = tuple(
            TombstoneRow(
                session_id=r.id,
                head=r.head,
                head_hash=r.head_hash,
                erased_at=erased_at,
                actor=actor,
                reason=reason,
                erased_with=None if r.pk == root.pk else root.id,
            )
            for r in family
        )
        tx.execute(insert(tombstones), [_fields(t) for t in marks])
        pks = [r.pk for r in family]
        released: set[bytes] = set()
        n_events = n_snapshots = 0
        # The permits are what the DELETE trigger checks; none outlives this call.
        tx.execute(
            insert(compaction_permits),
            [{"session_pk": pk, "upto": _ALL_VERSIONS} for pk in pks],
        )
        for chunk in self.iter_chunks(pks, CHUNK):
            in_chunk = list(chunk)
            for (md,) in tx.execute(
                select(snapshots.c.message_digests).where(snapshots.c.session_pk.in_(in_chunk))
            ):
                released.update(_split_digests(bytes(md)))
            n_events += tx.execute(delete(events).where(events.c.session_pk.in_(in_chunk))).rowcount
            n_events += self._drop_segments(tx, in_chunk)
            n_snapshots += tx.execute(
                delete(snapshots).where(snapshots.c.session_pk.in_(in_chunk))
            ).rowcount
            tx.execute(delete(compactions).where(compactions.c.session_pk.in_(in_chunk)))
            forget_info(tx, in_chunk)
        # Children before parents: a branch row refers to its parent's.
        for chunk in self.iter_chunks(pks[::-1], CHUNK):
            tx.execute(delete(sessions).where(sessions.c.pk.in_(list(chunk))))
        for chunk in self.iter_chunks(pks, CHUNK):
            tx.execute(
                delete(compaction_permits).where(compaction_permits.c.session_pk.in_(list(chunk)))
            )
        return Erasure(marks, int(n_events), int(n_snapshots), frozenset(released))

    def get_tombstone(self, tx: Tx, session_id: str) -> TombstoneRow | None:
        r = tx.execute(
            select(*tombstones.c).where(tombstones.c.session_id == session_id)
        ).mappings().first()
        return None if r is None else _tombstone(r)

    def list_tombstones(self, tx: Tx) -> list[TombstoneRow]:
        rows = tx.execute(select(*tombstones.c).order_by(tombstones.c.session_id)).mappings()
        return [_tombstone(r) for r in rows]

    def collect_blobs(self, tx: Tx, candidates: Iterable[bytes] | None = None) -> int:
        self._lock_snapshot_writes(tx)
        if candidates is None:
            unused = {bytes(d) for (d,) in tx.execute(select(snapshot_blobs.c.digest))}
        else:
            unused = {bytes(d) for d in candidates}
        if not unused:
            return 0
        for (md,) in tx.execute(select(snapshots.c.message_digests)):
            unused.difference_update(_split_digests(bytes(md)))
            if not unused:
                return 0
        deleted = 0
        for chunk in self.iter_chunks(sorted(unused), CHUNK):
            deleted += tx.execute(
                delete(snapshot_blobs).where(snapshot_blobs.c.digest.in_(list(chunk)))
            ).rowcount
        return int(deleted)


def _split_digests(message_digests: bytes) -> list[bytes]:
    n = DIGEST_SIZE
    return [message_digests[i : i + n] for i in range(0, len(message_digests), n)]


def _fields(record: Any) -> dict[str, Any]:
    """A storage record's fields by name (they are the table's column names)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _compaction(r: Any) -> CompactionRow:
    return CompactionRow(
        session_pk=r["session_pk"],
        upto=r["upto"],
        previous_baseline=r["previous_baseline"],
        baseline_hash=bytes(r["baseline_hash"]),
        baseline_turn=r["baseline_turn"],
        state_digest=bytes(r["state_digest"]),
        first_version=r["first_version"],
        removed_hashes=bytes(r["removed_hashes"]),
        compacted_at=r["compacted_at"],
        actor=r["actor"],
    )


def _tombstone(r: Any) -> TombstoneRow:
    return TombstoneRow(
        session_id=r["session_id"],
        head=r["head"],
        head_hash=bytes(r["head_hash"]),
        erased_at=r["erased_at"],
        actor=r["actor"],
        reason=r["reason"],
        erased_with=r["erased_with"],
    )

