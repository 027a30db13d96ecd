"""Sealed segments in SQL, for both backends: the readers' merge, and sealing itself.

A sealed turn's events are not rows of ``events`` any more but one ``event_segments`` row
(see ``eventstore/core/segments.py`` for the body). Every reader of events in
:class:`~eventstore.storage.sql.SqlStorage` reads its rows as before and then passes them
through one of the merges here, which add the events of the segments overlapping what was
asked (by version for a session, by feed number for the feed), decoded and checked. So
the engine and the features see exactly the rows they saw before sealing.

Sealing (:meth:`Sealing.seal_turns`) reads closed turns' rows under the session's row
lock (one statement for all of them), checks their chain, encodes them and writes each
turn's segment in place of its rows in the caller's transaction: on SQLite under a
compaction permit, on PostgreSQL through the owner's ``eventstore_seal`` function, one
call per turn sent in one pipeline (the dialect's :meth:`Sealing._write_segments`). A
caller that must give the lock back soon (the background sealer, once the store's appends
are back) passes ``stop``: the turns then go one at a time, and it is asked before each. The
sealed events' ids go into ``sealed_event_ids`` in the same transaction, so that an
append's duplicate check finds a sealed id with an index probe and decodes only the
segment holding it, not the session's whole sealed past.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select

from eventstore.core.rows import (
    ZERO_HASH,
    EventRow,
    FeedRow,
    LoadParts,
    SealableTurn,
    SealedEvent,
    SegmentHead,
    SessionRow,
)
from eventstore.errors import SegmentCorrupt, StorageError
from eventstore.storage.interface import SegmentCoder, Tx
from eventstore.storage.sql.statements import chunks
from eventstore.storage.schema import (
    EVENT_COLUMNS,
    compaction_permits,
    event_segments,
    events,
    sealed_event_ids,
    sessions,
)

__all__ = ["Sealing"]

_P = bindparam
_S = event_segments.c
_I = sealed_event_ids.c
# SQLite caps the bound parameters of one statement.
_ID_CHUNK = 500
_HEAD_COLS = (
    _S.session_pk,
    _S.first_version,
    _S.last_version,
    _S.prev_hash,
    _S.end_hash,
    _S.xact_digest,
    _S.min_xact,
    _S.max_xact,
)

# A session's segments meeting (after, upto], with their bodies, in version order.
S_SEGMENTS = (
    select(*_HEAD_COLS, _S.body)
    .where(_S.session_pk == _P("pk"), _S.last_version > _P("after"), _S.first_version <= _P("upto"))
    .order_by(_S.first_version)
)
# The same without bodies, either way round (a limited read decodes only what it needs).
_HEADS = select(*_HEAD_COLS).where(
    _S.session_pk == _P("pk"), _S.last_version > _P("after"), _S.first_version <= _P("upto")
)
S_HEADS_ASC = _HEADS.order_by(_S.first_version)
S_HEADS_DESC = _HEADS.order_by(_S.first_version.desc())
S_BODY = select(_S.body).where(_S.session_pk == _P("pk"), _S.first_version == _P("first"))
# The segment holding one version (segments of a session never overlap).
S_SEGMENT_AT = (
    select(*_HEAD_COLS, _S.body)
    .where(_S.session_pk == _P("pk"), _S.first_version <= _P("v"), _S.last_version >= _P("v"))
    .order_by(_S.first_version.desc())
    .limit(1)
)
# The feed: segments whose feed numbers meet [x, top], each with its session's id.
S_FEED_HEADS = (
    select(*_HEAD_COLS, sessions.c.id)
    .join_from(event_segments, sessions, sessions.c.pk == _S.session_pk)
    .where(_S.max_xact >= _P("x"), _S.min_xact <= _P("top"))
    .order_by(_S.min_xact)
)
_NO_TOP = 2**62
_E = events.c
# Sealing, one closed turn at a time: its rows with their feed numbers, the chain hash
# before it (a row's, or a segment's end), and on SQLite the writes that replace the rows.
S_SEAL_ROWS = (
    select(*EVENT_COLUMNS, _E.xact)
    .where(_E.session_pk == _P("pk"), _E.version >= _P("first"), _E.version <= _P("last"))
    .order_by(_E.version)
)
S_ROW_HASH = select(_E.hash).where(_E.session_pk == _P("pk"), _E.version == _P("v"))
S_SEGMENT_END = select(_S.end_hash).where(_S.session_pk == _P("pk"), _S.last_version == _P("v"))
I_SEGMENT = insert(event_segments).values(
    {c.name: _P(c.name, type_=c.type) for c in event_segments.c}
)
I_SEALED_ID = insert(sealed_event_ids).values(
    session_pk=_P("session_pk"), event_id=_P("event_id"), version=_P("version")
)
I_PERMIT = insert(compaction_permits).values(session_pk=_P("pk"), upto=_P("upto"))
D_SEALED_ROWS = delete(events).where(
    _E.session_pk == _P("pk"), _E.version >= _P("first"), _E.version <= _P("last")
)
D_PERMIT = delete(compaction_permits).where(compaction_permits.c.session_pk == _P("pk"))


def _head(r: Any) -> SegmentHead:
    return SegmentHead(r[0], r[1], r[2], bytes(r[3]), bytes(r[4]), bytes(r[5]), r[6], r[7])


def _one_each(rows: Sequence[EventRow]) -> list[EventRow]:
    """``rows`` (sorted by version) with each version once.

    A read whose statements see different snapshots (PostgreSQL's read committed) can meet
    an event twice when a seal commits between them: as the row its first statement read,
    then in the segment the second one read. The same event twice is that race; a row that
    differs from the sealed event at its version was inserted into a sealed range.
    """
    out: list[EventRow] = []
    for r in rows:
        if out and out[-1].version == r.version and out[-1].session_pk == r.session_pk:
            if out[-1] == r:
                continue
            raise SegmentCorrupt(
                f"session row {r.session_pk} version {r.version} is both a row and sealed: "
                "an event row was inserted into a sealed range; run `eventstore verify`",
                version=r.version,
            )
        out.append(r)
    return out


class Sealing:
    """The sealed-segment half of :class:`~eventstore.storage.sql.SqlStorage`."""

    segment_coder: SegmentCoder | None = None

    # Supplied by SqlStorage.
    def _fetchall(self, tx: Tx, q: Any, params: Any) -> list[Any]:
        raise NotImplementedError

    def _fetchone(self, tx: Tx, q: Any, params: Any) -> Any:
        raise NotImplementedError

    def _compile(self, stmt: Any) -> Any:
        raise NotImplementedError

    def _run(self, tx: Tx, q: Any, params: Any) -> Any:
        raise NotImplementedError

    def _runmany(self, tx: Tx, q: Any, seq: Any) -> None:
        raise NotImplementedError

    def _session_row(self, r: Any) -> SessionRow:
        raise NotImplementedError

    def _sealed_queries(self) -> None:
        c = self._compile
        self._q_segments = c(S_SEGMENTS)
        self._q_heads_asc = c(S_HEADS_ASC)
        self._q_heads_desc = c(S_HEADS_DESC)
        self._q_body = c(S_BODY)
        self._q_segment_at = c(S_SEGMENT_AT)
        self._q_feed_heads = c(S_FEED_HEADS)
        # Sealing runs in the writer's process: built once, not per turn.
        self._q_seal_rows = c(S_SEAL_ROWS)
        self._q_row_hash = c(S_ROW_HASH)
        self._q_segment_end = c(S_SEGMENT_END)
        self._q_insert_segment = c(I_SEGMENT)
        self._q_insert_sealed_id = c(I_SEALED_ID)
        self._q_insert_permit = c(I_PERMIT)
        self._q_delete_sealed_rows = c(D_SEALED_ROWS)
        self._q_delete_permit = c(D_PERMIT)

    def use_segments(self, coder: SegmentCoder) -> None:
        self.segment_coder = coder

    def _coder(self) -> SegmentCoder:
        coder = self.segment_coder
        if coder is None:
            raise StorageError("this storage holds sealed segments but was given no segment codec")
        return coder

    def _decode(self, head: SegmentHead, body: Any) -> list[SealedEvent]:
        return self._coder().decode(head, bytes(body))

    # -- reads by version ---------------------------------------------------------------

    def _merge_range(
        self,
        tx: Tx,
        session_pk: int,
        rows: list[EventRow],
        *,
        after: int,
        upto: int,
        limit: int | None,
        desc: bool,
    ) -> list[EventRow]:
        """``rows`` (of ``events``, in the asked order) with the sealed events of the range."""
        params = {"pk": session_pk, "after": after, "upto": upto}
        out = list(rows)
        if limit is None:
            found = self._fetchall(tx, self._q_segments, params)
            if not found:
                return rows
            for r in found:
                out += [e.row for e in self._decode(_head(r), r[8]) if after < e.row.version <= upto]
        else:
            heads = self._fetchall(tx, self._q_heads_desc if desc else self._q_heads_asc, params)
            if not heads:
                return rows
            for r in heads:
                h = _head(r)
                if len(out) >= limit:
                    out.sort(key=lambda e: e.version, reverse=desc)
                    out = _one_each(out)
                if len(out) >= limit:
                    del out[limit:]
                    edge = out[-1].version
                    # Every event of this segment and the next ones lies beyond the cut.
                    if (h.last_version < edge) if desc else (h.first_version > edge):
                        break
                body = self._fetchone(tx, self._q_body, {"pk": session_pk, "first": h.first_version})
                if body is None:
                    continue  # compacted or erased since the heads were read
                out += [e.row for e in self._decode(h, body[0]) if after < e.row.version <= upto]
        out.sort(key=lambda e: e.version, reverse=desc)
        out = _one_each(out)
        return out if limit is None else out[:limit]

    def _sealed_payloads(self, found: Sequence[Any], after: int, upto: int) -> tuple[tuple[int, bytes], ...]:
        """``(version, payload)`` of the sealed events in ``(after, upto]``, from rows of
        :data:`S_SEGMENTS` (a load's sealed part of its tail)."""
        coder = self._coder()
        out: list[tuple[int, bytes]] = []
        for r in found:
            out += coder.payloads(_head(r), bytes(r[8]), after, upto)
        out.sort()
        return tuple(out)

    def _complete_load(
        self,
        row: SessionRow,
        base: int,
        upto: int,
        n_tail: int,
        segments: Callable[[], Sequence[Any]],
        **parts: Any,
    ) -> LoadParts:
        """A load's parts from the snapshot at ``base`` and the ``n_tail`` payloads read as
        rows. If some of ``(base, upto]`` are sealed, their payloads (from the rows of
        :data:`S_SEGMENTS` that ``segments`` reads: one more round trip) are merged in by
        version; any other gap, or a race with a seal or a compaction, leaves the load to
        the general path (the row alone)."""
        sealed: tuple[tuple[int, bytes], ...] = ()
        if n_tail != upto - base:
            sealed = self._sealed_payloads(segments(), base, upto)
            if n_tail + len(sealed) != upto - base:
                return LoadParts(row)
        return LoadParts(row, complete=True, snap_version=base, n_tail=n_tail, sealed=sealed, **parts)

    def _sealed_event_at(self, tx: Tx, session_pk: int, version: int) -> EventRow | None:
        found = self._merge_range(tx, session_pk, [], after=version - 1, upto=version, limit=None, desc=False)
        return found[0] if found else None

    def _sealed_by_id(self, tx: Tx, session_pk: int, event_ids: set[str]) -> list[EventRow]:
        """The sealed events of a session carrying any of these ids: ``sealed_event_ids``
        says which versions hold them, and only the segments of those are decoded."""
        where: dict[int, str] = {}
        for chunk in chunks(sorted(event_ids), _ID_CHUNK):
            found = tx.execute(
                select(_I.version, _I.event_id).where(
                    _I.session_pk == session_pk, _I.event_id.in_(chunk)
                )
            ).all()
            where.update((int(r[0]), r[1]) for r in found)
        out: list[EventRow] = []
        decoded_upto = 0
        for v in sorted(where):
            if v <= decoded_upto:
                continue  # a hit of the segment decoded for the previous one
            r = self._fetchone(tx, self._q_segment_at, {"pk": session_pk, "v": v})
            if r is None:
                raise SegmentCorrupt(
                    f"session row {session_pk}: sealed event id {where[v]!r} names version {v}, "
                    "which no sealed segment holds; run `eventstore verify`",
                    version=v,
                )
            h = _head(r)
            decoded_upto = h.last_version
            out += [e.row for e in self._decode(h, r[8]) if e.row.event_id in event_ids]
        # The index and the segments are written together: any disagreement is an edit.
        got = {e.version: e.event_id for e in out}
        for v, event_id in where.items():
            if got.get(v) != event_id:
                raise SegmentCorrupt(
                    f"session row {session_pk}: sealed event id {event_id!r} is not the id of "
                    f"sealed version {v}; run `eventstore verify`",
                    version=v,
                )
        return out

    def sealed_id_mismatches(
        self, tx: Tx, session_pk: int
    ) -> list[tuple[int, str | None, str | None]]:
        table: dict[int, str] = {}
        extra: list[tuple[int, str]] = []  # a second id named at one version
        for r in tx.execute(
            select(_I.version, _I.event_id)
            .where(_I.session_pk == session_pk)
            .order_by(_I.version, _I.event_id)
        ).all():
            if int(r[0]) in table:
                extra.append((int(r[0]), r[1]))
            else:
                table[int(r[0])] = r[1]
        held: dict[int, str | None] = {}
        params = {"pk": session_pk, "after": 0, "upto": 2**31 - 1}
        heads = self._fetchall(tx, self._q_heads_asc, params)
        for r in heads:  # one body at a time: a long session's segments are not all in memory
            h = _head(r)
            body = self._fetchone(tx, self._q_body, {"pk": session_pk, "first": h.first_version})
            if body is not None:
                held.update((e.row.version, e.row.event_id) for e in self._decode(h, body[0]))
        out = [
            (v, held.get(v), table.get(v))
            for v in sorted(set(table) | {v for v, i in held.items() if i is not None})
            if held.get(v) != table.get(v)
        ]
        out += [(v, held.get(v), i) for v, i in extra if held.get(v) != i]
        out.sort(key=lambda m: m[0])
        return out

    # -- the feed -------------------------------------------------------------------------

    def _merge_feed(
        self,
        tx: Tx,
        rows: list[FeedRow],
        *,
        after: tuple[int, int, int],
        limit: int,
        top: int | None = None,
    ) -> list[FeedRow]:
        """A feed page's ``rows`` with the sealed events after ``after`` (and at or below
        ``top``), in feed order, cut at ``limit``."""
        x = after[0]
        top = _NO_TOP if top is None else top
        heads = self._fetchall(tx, self._q_feed_heads, {"x": x, "top": top})
        if not heads:
            return rows
        # Each segment holds an event at its min_xact, so the limit-th smallest of the rows'
        # numbers and the segments' lowest ones bounds the page: later segments are not read.
        marks = sorted([r[10] for r in rows] + [h[6] for h in heads if h[6] > x])
        bound = min(top, marks[limit - 1]) if len(marks) >= limit else top
        out = list(rows)
        for r in heads:
            if r[6] > bound:
                break
            h = _head(r)
            body = self._fetchone(tx, self._q_body, {"pk": h.session_pk, "first": h.first_version})
            if body is None:
                continue
            sid = r[8]
            for e in self._decode(h, body[0]):
                w = e.row
                if (e.xact, w.session_pk, w.version) > after and e.xact <= top:
                    out.append(
                        FeedRow(
                            w.session_pk, w.version, w.event_id, w.type, w.turn, w.payload,
                            w.recorded_at, w.actor, w.metadata, w.hash, e.xact, sid, w.native,
                        )
                    )
        # A row read before a seal and its sealed copy read after it are one event.
        unique = {(r[10], r[0], r[1]): r for r in out}
        return [unique[k] for k in sorted(unique)][:limit]

    # -- sealing ----------------------------------------------------------------------------

    def sealable_turns(self, tx: Tx, session_pk: int | None, limit: int) -> list[SealableTurn]:
        e = events.c
        stmt = (
            select(e.session_pk, e.turn, func.min(e.version), func.max(e.version))
            .join_from(events, sessions, sessions.c.pk == e.session_pk)
            .where(e.turn < sessions.c.head_turn)
            .group_by(e.session_pk, e.turn)
            .order_by(e.session_pk, e.turn)
            .limit(limit)
        )
        if session_pk is not None:
            stmt = stmt.where(e.session_pk == session_pk)
        return [SealableTurn(r[0], r[1], r[2], r[3], r[1]) for r in tx.execute(stmt)]

    def _lock_for_seal(self, tx: Tx, session_pk: int, *, wait: bool) -> SessionRow | None:
        stmt = self._seal_lock(select(*sessions.c).where(sessions.c.pk == session_pk), wait)
        r = tx.execute(stmt).first()
        return None if r is None else self._session_row(r)

    def _seal_lock(self, stmt: Any, wait: bool) -> Any:
        """Row locking for :meth:`_lock_for_seal` (SQLite: BEGIN IMMEDIATE locked already)."""
        return stmt

    def _seal_barrier(self, tx: Tx) -> int | None:
        """The feed number every sealed event must lie below (``None``: any)."""
        return None

    def _hash_before(self, tx: Tx, row: SessionRow, version: int) -> bytes | None:
        """The chain hash of version ``version`` of the session (its own row or segment,
        its baseline, or its parent's at the fork), or ``None`` when it is not found."""
        if version == 0:
            return ZERO_HASH
        r = self._fetchone(tx, self._q_row_hash, {"pk": row.pk, "v": version})
        if r is not None:
            return bytes(r[0])
        r = self._fetchone(tx, self._q_segment_end, {"pk": row.pk, "v": version})
        if r is not None:
            return bytes(r[0])
        if row.baseline == version and row.baseline_hash is not None:
            return row.baseline_hash
        if row.parent_pk is not None and row.fork_version == version:
            got: bytes | None = self.recorded_hash(tx, row.parent_pk, version)  # type: ignore[attr-defined]
            return got
        return None

    def seal_turns(
        self, tx: Tx, row: SessionRow, turns: Sequence[SealableTurn], hashed_as: str,
        stop: Callable[[], bool] | None = None,
    ) -> list[SealableTurn]:
        coder = self.segment_coder
        if coder is None:
            raise StorageError("this storage was given no segment codec")
        ordered = sorted(turns, key=lambda t: t.first)
        # Without ``stop``: one read of every row the turns span, one look at the barrier,
        # one write (PostgreSQL: one pipeline), each turn's chain checked from the hash its
        # predecessor ended on. With it: the same one turn at a time, asked before each
        # whether to stop, so that the caller's lock is held one turn past its asking.
        step = len(ordered) if stop is None else 1
        verified: dict[int, bytes] = {}  # version -> its recomputed (and recorded) hash
        barrier: int | None = None
        out: list[SealableTurn] = []
        for i in range(0, len(ordered), step or 1):
            if stop is not None and stop():
                break
            part = ordered[i : i + step]
            lo, hi = part[0].first, part[-1].last
            found = self._fetchall(tx, self._q_seal_rows, {"pk": row.pk, "first": lo, "last": hi})
            by_version = {
                int(r[1]): SealedEvent(
                    EventRow(
                        r[0], r[1], r[2], r[3], r[4], bytes(r[5]), r[6], r[7],
                        None if r[8] is None else bytes(r[8]), bytes(r[9]),
                        None if r[10] is None else bytes(r[10]),
                    ),
                    int(r[11]),
                )
                for r in found
            }
            if i == 0:
                barrier = self._seal_barrier(tx)
            done: list[tuple[SealableTurn, bytes, bytes, list[SealedEvent]]] = []
            for turn in part:
                sealed = [by_version.get(v) for v in range(turn.first, turn.last + 1)]
                if any(s is None for s in sealed):
                    continue  # sealed, compacted or erased since it was listed
                events_ = [s for s in sealed if s is not None]
                rows = [s.row for s in events_]
                if any(not turn.turn <= r.turn <= turn.last_turn for r in rows) or turn.last_turn >= row.head_turn:
                    continue
                if barrier is not None and max(s.xact for s in events_) >= barrier:
                    continue
                prev = verified.get(turn.first - 1) or self._hash_before(tx, row, turn.first - 1)
                if prev is None or coder.chain_end(prev, hashed_as, rows) != rows[-1].hash:
                    continue  # a chain that does not verify stays rows, for verify to report
                verified[turn.last] = rows[-1].hash
                done.append((turn, prev, coder.encode(events_, hashed_as), events_))
            if done:
                self._write_segments(tx, row.pk, done)
            out += [d[0] for d in done]
        return out

    def _write_segments(
        self, tx: Tx, pk: int, done: Sequence[tuple[SealableTurn, bytes, bytes, list[SealedEvent]]]
    ) -> None:
        """Insert the segments ``(turn, prev hash, body, events)`` and delete their rows
        (SQLite: under one compaction permit up to the last of them)."""
        coder = self.segment_coder
        assert coder is not None
        segments = []
        ids = []
        for turn, prev, body, sealed in done:
            xacts = [s.xact for s in sealed]
            segments.append(
                {
                    "session_pk": pk,
                    "first_version": turn.first,
                    "last_version": turn.last,
                    "first_turn": turn.turn,
                    "last_turn": turn.last_turn,
                    "min_xact": min(xacts),
                    "max_xact": max(xacts),
                    "prev_hash": prev,
                    "end_hash": sealed[-1].row.hash,
                    "xact_digest": coder.xact_digest(xacts),
                    "body": body,
                }
            )
            ids += [
                {"session_pk": pk, "event_id": s.row.event_id, "version": s.row.version}
                for s in sealed
                if s.row.event_id is not None
            ]
        self._runmany(tx, self._q_insert_segment, segments)
        if ids:
            self._runmany(tx, self._q_insert_sealed_id, ids)
        self._run(tx, self._q_insert_permit, {"pk": pk, "upto": max(d[0].last for d in done)}).close()
        self._runmany(
            tx, self._q_delete_sealed_rows, [{"pk": pk, "first": d[0].first, "last": d[0].last} for d in done]
        )
        self._run(tx, self._q_delete_permit, {"pk": pk}).close()

    # -- compaction and erasure -------------------------------------------------------------

    def _cut_segments(self, tx: Tx, session_pk: int, *, after: int, upto: int) -> int:
        """Remove the sealed events in ``(after, upto]`` (compaction): segments wholly inside
        go; one that straddles a bound is decoded, its events outside the range put back as
        rows (with their feed numbers: positions do not move; a later seal takes them again)
        and it goes. Returns how many sealed events were removed."""
        found = self._fetchall(tx, self._q_segments, {"pk": session_pk, "after": after, "upto": upto})
        removed = 0
        for r in found:
            h = _head(r)
            if after < h.first_version and h.last_version <= upto:
                removed += h.last_version - h.first_version + 1
                continue
            sealed = self._decode(h, r[8])
            kept = [e for e in sealed if not after < e.row.version <= upto]
            removed += len(sealed) - len(kept)
            if kept:
                tx.execute(
                    insert(events),
                    [
                        {
                            "session_pk": e.row.session_pk, "version": e.row.version,
                            "event_id": e.row.event_id, "type": e.row.type, "turn": e.row.turn,
                            "payload": e.row.payload, "recorded_at": e.row.recorded_at,
                            "actor": e.row.actor, "metadata": e.row.metadata, "hash": e.row.hash,
                            "xact": e.xact, "native": e.row.native,
                        }
                        for e in kept
                    ],
                )
            tx.execute(
                delete(event_segments).where(
                    _S.session_pk == session_pk, _S.first_version == h.first_version
                )
            )
            # Its kept events are rows again: their ids are in the events' own index.
            tx.execute(
                delete(sealed_event_ids).where(
                    _I.session_pk == session_pk,
                    _I.version >= h.first_version,
                    _I.version <= h.last_version,
                )
            )
        tx.execute(
            delete(event_segments).where(
                _S.session_pk == session_pk, _S.first_version > after, _S.last_version <= upto
            )
        )
        tx.execute(
            delete(sealed_event_ids).where(
                _I.session_pk == session_pk, _I.version > after, _I.version <= upto
            )
        )
        return removed

    def _drop_segments(self, tx: Tx, session_pks: Sequence[int]) -> int:
        """Delete every segment of these sessions (erasure): how many events they held."""
        where = _S.session_pk.in_(list(session_pks))
        n = tx.execute(
            select(func.coalesce(func.sum(_S.last_version - _S.first_version + 1), 0)).where(where)
        ).scalar()
        tx.execute(delete(event_segments).where(where))
        tx.execute(delete(sealed_event_ids).where(_I.session_pk.in_(list(session_pks))))
        return int(n or 0)

