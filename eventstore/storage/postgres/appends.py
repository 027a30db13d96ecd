"""PostgreSQL's appends: one statement, one round trip, in autocommit on a pooled connection."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eventstore.core.rows import CatalogueEffect, EventRow, SnapshotRow, TurnBatch, blob_refs
from eventstore.errors import StorageError
from eventstore.storage.catalogue import effect_params
from eventstore.storage.postgres.connections import Connections
from eventstore.storage.postgres.statements import append_batches_stmt, append_stmt, compile_hot
from eventstore.storage.sql import Compiled
from eventstore.storage.sql.statements import head_move_params

__all__ = ["HotAppends"]


def _effect_arrays(batches: Sequence[TurnBatch]) -> dict[str, list[Any]]:
    """The catalogue effects of a group commit, one array element per batch."""
    per = [effect_params(b.effect) for b in batches]
    return {k: [p[k] for p in per] for k in ("c_updated", "c_st_u", "c_st_n", "c_reset", "c_text")}


def _event_arrays(rows: Sequence[EventRow]) -> dict[str, list[Any]]:
    """The columns of the events an append writes that both append statements take as
    arrays (the fast one takes the time, actor and metadata once, for the whole batch)."""
    return {
        "e_versions": [r.version for r in rows],
        "e_ids": [r.event_id for r in rows],
        "e_types": [r.type for r in rows],
        "e_turns": [r.turn for r in rows],
        "e_payloads": [r.payload for r in rows],
        "e_hashes": [r.hash for r in rows],
    }


def _snapshot_arrays(snapshots: Sequence[SnapshotRow]) -> dict[str, list[Any]]:
    """The snapshots an append writes, one array a column (both append statements)."""
    return {
        "s_versions": [n.version for n in snapshots],
        "s_reducers": [n.reducer_version for n in snapshots],
        "s_rests": [n.rest for n in snapshots],
        "s_digests": [n.message_digests for n in snapshots],
    }


class HotAppends(Connections):
    """The append paths of :class:`~eventstore.storage.postgres.PostgresStorage`."""

    _q_append_one: Compiled
    _q_append_rows: Compiled
    _q_append_snapshots: Compiled
    _q_append_batches: Compiled

    def _append_queries(self) -> None:
        """Compile the append statement's variants (:func:`append_stmt`) once."""
        d = self.engine.dialect
        self._q_append_one = compile_hot(append_stmt(rows=False, snapshots=False), d)
        self._q_append_rows = compile_hot(append_stmt(rows=True, snapshots=False), d)
        self._q_append_snapshots = compile_hot(append_stmt(rows=True, snapshots=True), d)
        self._q_append_batches = compile_hot(append_batches_stmt(), d)

    def _append_fast(self, b: TurnBatch) -> bool:
        session_pk, old_head, old_hash = b.session_pk, b.old_head, b.old_hash
        rows, head_turn, snapshots, blobs, effect = b.rows, b.head_turn, b.snapshots, b.blobs, b.effect
        first = rows[0]
        # Batches with provider-native data take the general statement (the hot ones,
        # without, keep their arrays as they are).
        if any(
            (r.recorded_at, r.actor, r.metadata, r.native)
            != (first.recorded_at, first.actor, first.metadata, None)
            for r in rows
        ):
            return super()._append_fast(b)
        if len(rows) == 1 and not snapshots and not blobs:
            return self._append_one(session_pk, old_head, old_hash, first, head_turn, effect)
        refs = blob_refs(n.message_digests for n in snapshots)
        if not refs.keys() <= blobs.keys():
            # A blob named but not sent: only the general path can count it.
            return super()._append_fast(b)
        digests = sorted(blobs)
        params = {
            **head_move_params(session_pk, old_head, old_hash, rows[-1], head_turn, effect),
            "recorded_at": first.recorded_at,
            "actor": first.actor,
            "metadata": first.metadata,
            **_event_arrays(rows),
            "b_digests": digests,
            "b_bodies": [blobs[d] for d in digests],
            "b_refs": [refs.get(d, 0) for d in digests],
            **_snapshot_arrays(snapshots),
        }
        q = self._q_append_snapshots if snapshots or blobs else self._q_append_rows
        return self._run_hot(q, params, binary=True) == len(rows)

    def _append_batches(self, batches: Sequence[TurnBatch]) -> list[bool]:
        if not batches:
            return []
        events = [r for b in batches for r in b.rows]
        blobs: list[tuple[int, bytes, bytes, int]] = []
        for b in batches:
            refs = blob_refs(n.message_digests for n in b.snapshots)
            if not refs.keys() <= b.blobs.keys():
                raise StorageError("a grouped append's snapshot names a blob it does not send")
            blobs += [(b.session_pk, d, b.blobs[d], refs.get(d, 0)) for d in sorted(b.blobs)]
        snaps = [n for b in batches for n in b.snapshots]
        params = {
            "pks": [b.session_pk for b in batches],
            "old_heads": [b.old_head for b in batches],
            "old_hashes": [b.old_hash for b in batches],
            "writers": [b.writer for b in batches],
            "heads": [b.rows[-1].version if b.rows else b.old_head for b in batches],
            "hashes": [b.rows[-1].hash if b.rows else b.old_hash for b in batches],
            "turns": [b.head_turn for b in batches],
            "releases": [b.release for b in batches],
            "claims": [b.claim for b in batches],
            **_effect_arrays(batches),
            "seen": max(b.seen_at for b in batches),
            "e_pks": [r.session_pk for r in events],
            **_event_arrays(events),
            "e_times": [r.recorded_at for r in events],
            "e_actors": [r.actor for r in events],
            "e_metas": [r.metadata for r in events],
            "e_natives": [r.native for r in events],
            "b_pks": [b[0] for b in blobs],
            "b_digests": [b[1] for b in blobs],
            "b_bodies": [b[2] for b in blobs],
            "b_refs": [b[3] for b in blobs],
            "s_pks": [n.session_pk for n in snaps],
            **_snapshot_arrays(snaps),
        }
        with self._errors(), self._autocommit(hot=True) as cur:
            # Prepared: planning this statement costs about as much as running it.
            q = self._q_append_batches
            cur.execute(q.sql, q.args(params), binary=True, prepare=self._prepare_load or None)
            (moved,) = cur.fetchone()
        done = set(moved)
        if events and done:
            self._committed()
        return [b.session_pk in done for b in batches]

    def _append_one(
        self,
        session_pk: int,
        old_head: int,
        old_hash: bytes,
        row: EventRow,
        head_turn: int,
        effect: CatalogueEffect | None = None,
    ) -> bool:
        params = {
            **head_move_params(session_pk, old_head, old_hash, row, head_turn, effect),
            "event_id": row.event_id,
            "type": row.type,
            "payload": row.payload,
            "recorded_at": row.recorded_at,
            "actor": row.actor,
            "metadata": row.metadata,
        }
        return self._run_hot(self._q_append_one, params, binary=False) == 1

    def _run_hot(self, q: Compiled, params: Mapping[str, Any], *, binary: bool) -> int:
        """Run one append statement on a pooled connection; its row count.

        A statement whose last part is a SELECT reports its first column instead.
        """
        with self._errors(), self._autocommit(hot=True) as cur:
            cur.execute(q.sql, q.args(params), binary=binary)
            if cur.description is None:
                count = int(cur.rowcount)
            else:
                (count,) = cur.fetchone()  # the statement's one column
        if count:
            self._committed()
        return int(count)
