"""Sessions and appends: session rows, head moves with their version check, event inserts, turn leases."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, insert, select, update

from eventstore.core.rows import (
    CatalogueEffect,
    EventRow,
    NewSession,
    SessionControl,
    SessionRow,
    SnapshotRow,
    TurnBatch,
)
from eventstore.errors import StorageError
from eventstore.storage.catalogue import effect_params
from eventstore.storage.interface import Tx
from eventstore.storage.schema import events, sessions
from eventstore.storage.sql.statements import (
    CHUNK,
    EVENT_KEYS,
    SESSION_COLS,
    WITH_HEAD_EVENT,
    chunks,
    event_params,
    event_values,
    head_move_params,
    session_row,
)
from eventstore.storage.sql.transactions import SqlTransactions

__all__ = ["SessionWrites"]


def _control(r: Any) -> SessionControl:
    """A session's control columns, and the head event's when the row has them."""
    head = "payload" in r._fields
    return SessionControl(
        pk=r.pk,
        head=r.head,
        head_hash=bytes(r.head_hash),
        writer=r.writer,
        writer_seen=r.writer_seen,
        closed_at=r.closed_at,
        closed_reason=r.closed_reason,
        head_type=r.type if head else None,
        head_payload=None if not head or r.payload is None else bytes(r.payload),
        head_recorded_at=r.recorded_at if head else None,
    )


class SessionWrites(SqlTransactions):
    """Creating sessions and moving their heads: every append ends here."""

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
        if pk is not None:
            if lock:
                return self._session_seen(self._lock_for_seal(tx, pk, wait=wait))
            r = self._fetchone(tx, self._q_get_session_pk, {"pk": pk})
        else:
            r = self._fetchone(tx, self._q_lock_session if lock else self._q_get_session, {"id": id})
        return None if r is None else self._session_seen(session_row(r))

    def sessions(self, tx: Tx, *, descendants_of: int | None = None) -> list[SessionRow]:
        if descendants_of is None:
            rows = tx.execute(select(*SESSION_COLS).order_by(sessions.c.pk)).all()
            return [session_row(r) for r in rows]
        out: list[SessionRow] = []
        frontier = [descendants_of]
        while frontier:
            children: list[SessionRow] = []
            for chunk in chunks(frontier, CHUNK):
                found = tx.execute(
                    select(*SESSION_COLS)
                    .where(sessions.c.parent_pk.in_(list(chunk)))
                    .order_by(sessions.c.pk)
                ).all()
                children.extend(session_row(r) for r in found)
            out.extend(children)
            frontier = [c.pk for c in children]
        return out

    def insert_session(self, tx: Tx, new: NewSession) -> SessionRow | None:
        stmt = (
            self._insert_ignore(sessions)
            .values(
                id=new.id,
                parent_pk=new.parent_pk,
                fork_version=new.fork_version,
                head=new.head,
                head_hash=new.head_hash,
                head_turn=new.head_turn,
                baseline=new.baseline,
                baseline_hash=new.baseline_hash,
                baseline_turn=new.baseline_turn,
                created_at=new.created_at,
                status=new.status,
                first_text=new.first_text,
                updated_at=new.created_at,
            )
            .returning(*SESSION_COLS)
        )
        r = tx.execute(stmt).first()
        return None if r is None else self._session_seen(session_row(r))

    def _session_seen(self, row: SessionRow | None) -> SessionRow | None:
        """A session row just read or inserted (a backend that caches what it learns from
        one, such as PostgreSQL's session keys, overrides this)."""
        return row

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
        changed = True
        if head is not None:
            version, head_hash, head_turn = head
            self._run(
                tx,
                self._q_set_head,
                {"p_pk": pk, "p_head": version, "p_hash": head_hash, "p_turn": head_turn},
            ).close()
        if writer is not None:
            stmt = update(sessions).where(sessions.c.pk == pk)
            if only_if is not None:
                stmt = stmt.where(sessions.c.writer == only_if)
            values = stmt.values(writer=writer[0], writer_seen=writer[1])
            changed = bool(tx.execute(values).rowcount == 1)
        if closed is not None:
            tx.execute(
                update(sessions)
                .where(sessions.c.pk == pk)
                .values(closed_at=closed[0], closed_reason=closed[1])
            )
        return changed

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
        params = head_move_params(session_pk, old_head, old_hash, rows[-1], head_turn, effect)
        cur = self._run(tx, self._q_move_head, params)
        moved = bool(cur.rowcount == 1)
        cur.close()
        if moved:
            self._insert_rows(tx, rows)
        return moved

    def append(self, batches: Sequence[TurnBatch]) -> list[bool]:
        if len(batches) == 1 and batches[0].writer is None and batches[0].rows:
            # One plain append: the backend's fastest statement for it.
            return [self._append_fast(batches[0])]
        return self._append_batches(batches)

    def _append_fast(self, b: TurnBatch) -> bool:
        """Write one plain batch (no writer lease), in a transaction of its own; whether
        the head was still ``b.old_head``. Backends override it with a faster path."""
        with self.write() as tx:
            return self._append_plain(tx, b)

    def _append_plain(self, tx: Tx, b: TurnBatch) -> bool:
        """Move the head and write the rows and snapshots of a plain batch in ``tx``."""
        moved = self.append_at(tx, b.session_pk, b.old_head, b.old_hash, b.rows, b.head_turn, b.effect)
        if not moved:
            return False
        for i, snap in enumerate(b.snapshots):
            self.put_snapshot(tx, snap, b.blobs if i == 0 else {})
        return True


    # -- streaming turns ------------------------------------------------------------------

    def controls(
        self, tx: Tx, pk: int | None = None, *, with_head_event: bool = False
    ) -> dict[int, SessionControl]:
        if pk is None:
            rows = tx.execute(WITH_HEAD_EVENT).all()
            return {r.pk: _control(r) for r in rows}
        q = self._q_control_head if with_head_event else self._q_control
        r = self._fetchone(tx, q, {"pk": pk})
        if r is None:
            raise StorageError(f"session row {pk} vanished; run `eventstore verify`")
        return {pk: _control(r)}

    def _append_batches(self, batches: Sequence[TurnBatch]) -> list[bool]:
        written: list[bool] = []
        with self.write() as tx:
            rows: list[EventRow] = []
            snaps: list[tuple[SnapshotRow, Mapping[bytes, bytes]]] = []
            for b in batches:
                last = b.rows[-1] if b.rows else None
                cur = self._run(
                    tx,
                    self._q_move_head
                    if b.writer is None
                    else self._q_turn_claim
                    if b.claim
                    else self._q_turn_release
                    if b.release
                    else self._q_turn_move,
                    {
                        "p_pk": b.session_pk,
                        "p_old_head": b.old_head,
                        "p_old_hash": b.old_hash,
                        # A claim that also releases takes the lease and gives it up at once.
                        "p_writer": None if b.claim and b.release else b.writer,
                        "p_head": b.old_head if last is None else last.version,
                        "p_hash": b.old_hash if last is None else last.hash,
                        "p_turn": b.head_turn,
                        "p_seen": None if b.claim and b.release else b.seen_at,
                        **effect_params(b.effect),
                    },
                )
                moved = bool(cur.rowcount == 1)
                cur.close()
                written.append(moved)
                if moved:
                    rows.extend(b.rows)
                    snaps.extend((n, b.blobs if i == 0 else {}) for i, n in enumerate(b.snapshots))
            if rows:
                self._insert_rows(tx, rows)
            for snap, blobs in snaps:
                self.put_snapshot(tx, snap, blobs)
        return written

    # -- events -------------------------------------------------------------------------

    def insert_events(self, tx: Tx, rows: Sequence[EventRow], *, before: int | None = None) -> bool:
        if before is not None:
            return self._restore_events(tx, rows, before=before)
        self._insert_rows(tx, rows)
        return True

    def _insert_rows(self, tx: Tx, rows: Sequence[EventRow]) -> None:
        """Insert a batch of events in one round trip where the driver allows."""
        q = self._q_insert_events
        if q.keys == EVENT_KEYS and not q.defaults:
            # Positional (SQLite's qmark) in EventRow's field order: the tuples go straight
            # to the driver's executemany, no per-row dict.
            cur = tx.connection.cursor()
            try:
                cur.executemany(q.sql, [event_values(r) for r in rows])
            finally:
                cur.close()
            return
        self._runmany(
            tx,
            self._q_insert_events,
            [event_params(r) for r in rows],
        )

    def _restore_events(self, tx: Tx, rows: Sequence[EventRow], *, before: int) -> bool:
        if not rows:
            return True
        pk = rows[0].session_pk
        above = tx.execute(
            select(events.c.xact).where(events.c.session_pk == pk, events.c.version == before)
        ).scalar()
        if above is None:
            self._insert_rows(tx, rows)
            return True
        below = tx.execute(
            select(func.max(events.c.xact)).where(
                events.c.session_pk == pk, events.c.version < rows[0].version
            )
        ).scalar()
        xacts = self._restore_xacts(tx, len(rows), int(below or 0), int(above))
        if xacts is None:
            return False
        # Not the hot insert: a restore is rare, and its feed numbers are given, not computed.
        tx.execute(
            insert(events),
            [{**event_params(r), "xact": x} for r, x in zip(rows, xacts)],
        )
        return True

    def _restore_xacts(self, tx: Tx, n: int, below: int, above: int) -> list[int] | None:
        """The feed numbers of ``n`` restored events of a session, ascending, between the
        number of its nearest event below them (``below``, 0: none) and of its first event
        above (``above``); ``None`` when there are none to give."""
        raise NotImplementedError
