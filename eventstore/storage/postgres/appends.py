"""PostgreSQL's appends: one statement, one round trip, in autocommit on a pooled connection."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from eventstore.core.rows import EventRow, SnapshotRow, TurnBatch, blob_refs
from eventstore.errors import StorageError
from eventstore.storage.catalogue import EFFECT_TYPES, effect_params
from eventstore.storage.postgres.connections import Connections
from eventstore.storage.postgres.statements import append_batches_stmt, append_stmt, compile_hot
from eventstore.storage.sql import Compiled
from eventstore.storage.sql.statements import head_move_params

__all__ = ["HotAppends"]


def _columns(items: Sequence[Any], **fields: str) -> dict[str, list[Any]]:
    """One array parameter per field of ``items`` (``parameter=field``)."""
    return {param: [getattr(i, field) for i in items] for param, field in fields.items()}


def _event_arrays(rows: Sequence[EventRow]) -> dict[str, list[Any]]:
    """The columns of the events an append writes that both append statements take as
    arrays (the fast one takes the time, actor and metadata once, for the whole batch)."""
    return _columns(
        rows, e_versions="version", e_ids="event_id", e_types="type", e_turns="turn",
        e_payloads="payload", e_hashes="hash",
    )


def _snapshot_arrays(snapshots: Sequence[SnapshotRow]) -> dict[str, list[Any]]:
    """The snapshots an append writes, one array a column (both append statements)."""
    return _columns(
        snapshots, s_versions="version", s_reducers="reducer_version", s_rests="rest",
        s_digests="message_digests",
    )


class _Blob(NamedTuple):
    pk: int
    digest: bytes
    body: bytes
    refs: int  # the references the batch's snapshots add


def _blob_rows(b: TurnBatch) -> list[_Blob] | None:
    """The blobs a batch sends, in digest order; None if a snapshot names a blob the
    batch does not send (only the general path can count that one)."""
    refs = blob_refs(n.message_digests for n in b.snapshots)
    if not refs.keys() <= b.blobs.keys():
        return None
    return [_Blob(b.session_pk, d, b.blobs[d], refs.get(d, 0)) for d in sorted(b.blobs)]


def _blob_arrays(blobs: Sequence[_Blob]) -> dict[str, list[Any]]:
    """The blobs an append stores, one array a column (both append statements)."""
    return _columns(blobs, b_digests="digest", b_bodies="body", b_refs="refs")


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
        rows, first = b.rows, b.rows[0]
        # Batches with provider-native data take the general statement (the hot ones,
        # without, keep their arrays as they are).
        if any(
            (r.recorded_at, r.actor, r.metadata, r.native)
            != (first.recorded_at, first.actor, first.metadata, None)
            for r in rows
        ):
            return super()._append_fast(b)
        params = {
            **head_move_params(b.session_pk, b.old_head, b.old_hash, rows[-1], b.head_turn, b.effect),
            "recorded_at": first.recorded_at,
            "actor": first.actor,
            "metadata": first.metadata,
        }
        if len(rows) == 1 and not b.snapshots and not b.blobs:
            # One event from scalars (see append_stmt): its row count says whether it was.
            one = {"event_id": first.event_id, "type": first.type, "payload": first.payload}
            return self._run_hot(self._q_append_one, {**params, **one}, binary=False) == 1
        blobs = _blob_rows(b)
        if blobs is None:
            return super()._append_fast(b)
        params |= {
            **_event_arrays(rows),
            **_blob_arrays(blobs),
            **_snapshot_arrays(b.snapshots),
        }
        q = self._q_append_snapshots if b.snapshots or b.blobs else self._q_append_rows
        return self._run_hot(q, params, binary=True) == len(rows)

    def _append_batches(self, batches: Sequence[TurnBatch]) -> list[bool]:
        if not batches:
            return []
        events = [r for b in batches for r in b.rows]
        blobs: list[_Blob] = []
        for b in batches:
            sent = _blob_rows(b)
            if sent is None:
                raise StorageError("a grouped append's snapshot names a blob it does not send")
            blobs += sent
        snaps = [n for b in batches for n in b.snapshots]
        per = [effect_params(b.effect) for b in batches]
        params = {
            **_columns(
                batches, pks="session_pk", old_heads="old_head", old_hashes="old_hash",
                writers="writer", turns="head_turn", releases="release", claims="claim",
            ),
            "heads": [b.rows[-1].version if b.rows else b.old_head for b in batches],
            "hashes": [b.rows[-1].hash if b.rows else b.old_hash for b in batches],
            # The catalogue effects, one array element per batch.
            **{k: [p[k] for p in per] for k in EFFECT_TYPES},
            "seen": max(b.seen_at for b in batches),
            **_columns(
                events, e_pks="session_pk", e_times="recorded_at", e_actors="actor",
                e_metas="metadata", e_natives="native",
            ),
            **_event_arrays(events),
            **_columns(blobs, b_pks="pk"),
            **_blob_arrays(blobs),
            **_columns(snaps, s_pks="session_pk"),
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
