"""Compaction and erasure: events deleted under permits, their audit records, tombstones."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import fields
from typing import Any, TypeVar, cast

from sqlalchemy import delete, insert, select, update

from eventstore.core.rows import CompactionRow, Erasure, RewindRow, TombstoneRow
from eventstore.storage.catalogue import forget as forget_info
from eventstore.storage.interface import Tx
from eventstore.storage.schema import (
    compaction_permits,
    compactions,
    events,
    sessions,
    snapshots,
    tombstones,
)
from eventstore.storage.sql.statements import CHUNK, chunks
from eventstore.storage.sql.rewinds import select_rewinds
from eventstore.storage.sql.snapshots import drop_snapshots
from eventstore.storage.sql.transactions import SqlTransactions

__all__ = ["Compaction"]

#: The kinds of audit records: what compactions removed, erased sessions, rewinds.
R = TypeVar("R", CompactionRow, TombstoneRow, RewindRow)

# An erasure's permit covers every version a session can have (versions are int4).
_ALL_VERSIONS = 2**31 - 1


class Compaction(SqlTransactions):
    """The operations that delete history: compaction and erasure."""

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
        drop_snapshots(
            tx,
            snapshots.c.session_pk == session_pk,
            snapshots.c.version > keep_upto,
            snapshots.c.version < upto,
        )
        tx.execute(delete(compaction_permits).where(compaction_permits.c.session_pk == session_pk))
        return int(deleted or 0) + self._cut_segments(tx, session_pk, after=keep_upto, upto=upto)

    # -- audit: compaction records, erasure, blob collection ------------------------------

    def insert_compaction(self, tx: Tx, rec: CompactionRow) -> None:
        tx.execute(insert(compactions).values(**_fields(rec)))

    def records(
        self,
        tx: Tx,
        kind: type[R],
        *,
        session_pk: int | None = None,
        session_id: str | None = None,
        pks: Collection[int] | None = None,
    ) -> list[R]:
        out: list[Any]
        if kind is CompactionRow:
            rows = tx.execute(
                select(*compactions.c)
                .where(compactions.c.session_pk == session_pk)
                .order_by(compactions.c.upto)
            ).mappings()
            out = [_compaction(r) for r in rows]
        elif kind is TombstoneRow:
            stmt = select(*tombstones.c).order_by(tombstones.c.session_id)
            if session_id is not None:
                stmt = stmt.where(tombstones.c.session_id == session_id)
            out = [_tombstone(r) for r in tx.execute(stmt).mappings()]
        else:
            out = select_rewinds(tx, session_id=session_id, pks=pks)
        return cast("list[R]", out)

    def recorded_hash(self, tx: Tx, session_pk: int, version: int) -> bytes | None:
        found = self.read_events(tx, session_pk, after=version - 1, upto=version)
        if found:
            return found[0].hash
        for rec in self.records(tx, CompactionRow, session_pk=session_pk):
            h = rec.hash_at(version)
            if h is not None:
                return h
        return None

    def erase_session(
        self,
        tx: Tx,
        session_pk: int,
        *,
        erased_at: int,
        actor: str | None,
        reason: str,
    ) -> Erasure:
        root = self._session_by_pk(tx, session_pk)
        family = [root, *self.sessions(tx, descendants_of=session_pk)]
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
        for chunk in chunks(pks, CHUNK):
            in_chunk = list(chunk)
            n_events += tx.execute(delete(events).where(events.c.session_pk.in_(in_chunk))).rowcount
            n_events += self._drop_segments(tx, in_chunk)
            n, named = drop_snapshots(tx, snapshots.c.session_pk.in_(in_chunk))
            n_snapshots += n
            released |= named
            tx.execute(delete(compactions).where(compactions.c.session_pk.in_(in_chunk)))
            forget_info(tx, in_chunk)
        # Children before parents: a branch row refers to its parent's.
        for chunk in chunks(pks[::-1], CHUNK):
            tx.execute(delete(sessions).where(sessions.c.pk.in_(list(chunk))))
        for chunk in chunks(pks, CHUNK):
            tx.execute(
                delete(compaction_permits).where(compaction_permits.c.session_pk.in_(list(chunk)))
            )
        return Erasure(marks, int(n_events), int(n_snapshots), frozenset(released))


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

