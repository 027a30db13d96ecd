"""Snapshots, their message blobs, and a whole session's load in one read transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from sqlalchemy import and_, bindparam, delete, exists, func, or_, select

from eventstore.core.rows import DIGEST_SIZE, LoadParts, Segment, SnapshotRow, blob_refs
from eventstore.storage.interface import Tx
from eventstore.storage.schema import event_segments, sessions, snapshot_blobs, snapshots
from eventstore.storage.sql.statements import (
    CHUNK,
    S_ADD_BLOB_REFS,
    S_DROP_BLOB_REFS,
    SNAPSHOT_COLS,
    Compiled,
    chunks,
    compiled,
    session_row,
)
from eventstore.storage.sql.transactions import SqlTransactions

__all__ = ["Snapshots", "drop_snapshots", "release_blobs"]

_P = bindparam


def _snapshot(r: Any) -> SnapshotRow:
    return SnapshotRow(
        session_pk=r.session_pk,
        version=r.version,
        reducer_version=r.reducer_version,
        rest=bytes(r.rest),
        message_digests=bytes(r.message_digests),
    )


def release_blobs(tx: Tx, refs: Mapping[bytes, int]) -> int:
    """Take these references (digest -> count) away and delete the blobs left with none;
    the number of blobs deleted.

    Safe beside snapshot writes: a writer naming a blob takes its row's lock and raises its
    count before committing, so this either waits for it and sees the count above zero, or
    deletes first and makes the writer insert the blob again (every snapshot write sends
    the bodies of its blobs). Rows are locked in digest order, as the writers lock them.
    """
    if not refs:
        return 0
    tx.execute(S_DROP_BLOB_REFS, [{"d": d, "n": n} for d, n in sorted(refs.items())])
    deleted = 0
    for chunk in chunks(sorted(refs), CHUNK):
        b = snapshot_blobs.c
        unused = delete(snapshot_blobs).where(b.digest.in_(list(chunk)), b.refs <= 0)
        deleted += tx.execute(unused).rowcount
    return int(deleted)


def drop_snapshots(tx: Tx, *where: Any) -> tuple[int, set[bytes]]:
    """Delete the snapshots matching ``where`` and release their blobs: the number of
    snapshots deleted and the digests they named."""
    gone = delete(snapshots).where(*where).returning(snapshots.c.message_digests)
    mds = [bytes(md) for (md,) in tx.execute(gone)]
    refs = blob_refs(mds)
    release_blobs(tx, refs)
    return len(mds), set(refs)


@cache
def latest_stmt(n_segments: int, n_baselines: int) -> Any:
    """The newest usable snapshot of a lineage with that many segments and baselines (one
    statement object per shape, so its compiled form is shared: see ``compiled``)."""
    at_baseline = [
        and_(snapshots.c.session_pk == _P(f"bpk{i}"), snapshots.c.version == _P(f"bv{i}"))
        for i in range(n_baselines)
    ]
    usable = or_(snapshots.c.reducer_version == _P("rv"), *at_baseline)
    # A snapshot *at* a segment's lower end is the state of the previous segment's
    # tip, so it is as good as one inside: `version >= after` (but never version 0).
    within = or_(
        *(
            and_(
                snapshots.c.session_pk == _P(f"spk{i}"),
                snapshots.c.version > 0,
                snapshots.c.version >= _P(f"sa{i}"),
                snapshots.c.version <= _P(f"su{i}"),
            )
            for i in range(n_segments)
        ),
        *at_baseline,
    )
    by_version = snapshots.c.version.desc()
    return select(*SNAPSHOT_COLS).where(within, usable).order_by(by_version).limit(1)


class Snapshots(SqlTransactions):
    """Writing and finding snapshots, and the load that starts from one."""

    def _latest_query(self, n_segments: int, n_baselines: int) -> Compiled:
        """The newest-usable-snapshot query for a lineage shape, compiled once per shape."""
        key = (n_segments, n_baselines)
        q = self._q_latest.get(key)
        if q is None:
            q = compiled(latest_stmt(n_segments, n_baselines), self.engine.dialect)
            self._q_latest[key] = q
        return q

    def snapshots(
        self,
        tx: Tx,
        segments: Sequence[Segment],
        *,
        usable_by: int | None = None,
        baselines: Sequence[tuple[int, int]] = (),
    ) -> list[SnapshotRow]:
        if usable_by is None:
            out: list[SnapshotRow] = []
            for s in segments:
                rows = self._fetchall(
                    tx, self._q_snapshots, {"pk": s.session_pk, "after": s.after, "upto": s.upto}
                )
                out += [_snapshot(r) for r in rows]
            return out
        if not segments and not baselines:
            return []
        params: dict[str, Any] = {"rv": usable_by}
        for i, s in enumerate(segments):
            params[f"spk{i}"], params[f"sa{i}"], params[f"su{i}"] = s.session_pk, s.after, s.upto
        for i, (pk, v) in enumerate(baselines):
            params[f"bpk{i}"], params[f"bv{i}"] = pk, v
        r = self._fetchone(tx, self._latest_query(len(segments), len(baselines)), params)
        return [] if r is None else [_snapshot(r)]

    def put_snapshot(self, tx: Tx, snap: SnapshotRow, blobs: Mapping[bytes, bytes]) -> None:
        refs = blob_refs([snap.message_digests])
        if blobs:
            self._runmany(
                tx,
                self._q_insert_blobs,
                [{"digest": d, "body": blobs[d], "refs": refs.get(d, 0)} for d in sorted(blobs)],
            )
        held = [{"d": d, "n": n} for d, n in refs.items() if d not in blobs]
        if held:
            self._runmany(tx, self._q_add_blob_refs, held)
        key = {"pk": snap.session_pk, "v": snap.version}
        replaced = self._fetchone(tx, self._q_snapshot_digests, key)
        if replaced is not None:  # written over (a compaction's baseline): its names go
            release_blobs(tx, blob_refs([bytes(replaced[0])]))
        self._run(
            tx,
            self._q_upsert_snapshot,
            {
                "session_pk": snap.session_pk,
                "version": snap.version,
                "reducer_version": snap.reducer_version,
                "rest": snap.rest,
                "message_digests": snap.message_digests,
            },
        ).close()

    def thin_snapshots(
        self, tx: Tx, session_pk: int, *, first: int, last: int, keep_every: int
    ) -> int:
        s, g = snapshots.c, event_segments.c
        newest = select(func.max(s.version)).where(s.session_pk == session_pk).scalar_subquery()
        baseline = select(sessions.c.baseline).where(sessions.c.pk == session_pk).scalar_subquery()
        n, _ = drop_snapshots(
            tx,
            s.session_pk == session_pk,
            s.version.between(first, last),
            s.version % keep_every != 0,
            s.version != baseline,
            s.version < newest,
            exists().where(
                g.session_pk == session_pk,
                g.first_version <= s.version,
                g.last_version >= s.version,
            ),
        )
        return n

    def ordered_bodies(self, tx: Tx, message_digests: bytes) -> list[bytes | None]:
        n = len(message_digests) // DIGEST_SIZE
        if not n:
            return []
        found = self._fetchcolumn(tx, self._q_ordered_blobs, {"md": message_digests, "n": n})
        return [None if b is None else b if type(b) is bytes else bytes(b) for b in found]

    def load_parts(
        self, session_id: str, version: int | None, reducer_version: int
    ) -> LoadParts | None:
        # In one read transaction: the session row, the newest usable snapshot, its
        # stored blobs in snapshot order (one statement: the digests are split by a
        # recursive CTE, so no parameter list and no digest->body dict), the tail.
        with self._hot_read() as tx:
            r = self._fetchone(tx, self._q_get_session, {"id": session_id})
            if r is None:
                return LoadParts(None)
            row = session_row(r)
            v = row.head if version is None else version
            if row.parent_pk is not None or not (row.baseline <= v <= row.head):
                return LoadParts(row)  # a branch, or a version the store refuses
            base = 0
            rest: bytes | None = None
            bodies: tuple[bytes, ...] = ()
            n_digests = n_found = 0
            baselines = [(row.pk, row.baseline)] if 0 < row.baseline <= v else []
            found = self.snapshots(
                tx, [Segment(row.pk, 0, v)], usable_by=reducer_version, baselines=baselines
            )
            snap = found[0] if found else None
            if snap is not None:
                base, rest = snap.version, snap.rest
                ordered = self.ordered_bodies(tx, snap.message_digests)
                bodies = tuple(b for b in ordered if b is not None)
                n_digests, n_found = len(ordered), len(bodies)
            payloads = self._fetchcolumn(
                tx, self._q_read_payloads, {"pk": row.pk, "after": base, "upto": v}
            )
            return self._complete_load(
                row,
                base,
                v,
                len(payloads),
                lambda: self._fetchall(tx, self._q_segments, {"pk": row.pk, "after": base, "upto": v}),
                rest=rest,
                bodies=bodies,
                n_digests=n_digests,
                n_found=n_found,
                tail=b",".join(payloads),
            )
