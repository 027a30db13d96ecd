"""Event reads by version range and by id, merged with the sealed segments' events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

from sqlalchemy import select

from eventstore.core.rows import EventRow
from eventstore.storage.interface import Tx
from eventstore.storage.schema import EVENT_COLUMNS, events
from eventstore.storage.sql.statements import CHUNK, MAX_VERSION, chunks
from eventstore.storage.sql.transactions import SqlTransactions

__all__ = ["EventReads"]

_NO_LIMIT = 2**62


def _event(r: Any) -> EventRow:
    return EventRow(
        session_pk=r.session_pk,
        version=r.version,
        event_id=r.event_id,
        type=r.type,
        turn=r.turn,
        payload=bytes(r.payload),
        recorded_at=r.recorded_at,
        actor=r.actor,
        metadata=None if r.metadata is None else bytes(r.metadata),
        hash=bytes(r.hash),
        native=None if r.native is None else bytes(r.native),
    )


class EventReads(SqlTransactions):
    """An event log's reads: rows of ``events``, then the sealed events of the range."""

    @overload
    def read_events(
        self,
        tx: Tx,
        session_pk: int,
        *,
        after: int = 0,
        upto: int = MAX_VERSION,
        limit: int | None = None,
        desc: bool = False,
        ids: Sequence[str] | None = None,
        payloads: Literal[False] = False,
    ) -> list[EventRow]: ...

    @overload
    def read_events(
        self, tx: Tx, session_pk: int, *, after: int = 0, upto: int = MAX_VERSION, payloads: Literal[True]
    ) -> list[bytes]: ...

    def read_events(
        self,
        tx: Tx,
        session_pk: int,
        *,
        after: int = 0,
        upto: int = MAX_VERSION,
        limit: int | None = None,
        desc: bool = False,
        ids: Sequence[str] | None = None,
        payloads: bool = False,
    ) -> list[EventRow] | list[bytes]:
        if payloads:
            return self._read_payloads(tx, session_pk, after=after, upto=upto)
        if ids is not None:
            return self._events_by_id(tx, session_pk, ids)
        if upto == after + 1 and not desc and limit != 0:
            # One version: its own statement, the sealed segments read only when it is not a row.
            r = self._fetchone(tx, self._q_event_at, {"pk": session_pk, "version": upto})
            if r is not None:
                return [_event(r)]
            found = self._sealed_event_at(tx, session_pk, upto)
            return [] if found is None else [found]
        q = self._q_read_desc if desc else self._q_read_asc
        params = {
            "pk": session_pk,
            "after": after,
            "upto": upto,
            "lim": _NO_LIMIT if limit is None else limit,
        }
        rows = [_event(r) for r in self._fetchall(tx, q, params)]
        return self._merge_range(tx, session_pk, rows, after=after, upto=upto, limit=limit, desc=desc)

    def _events_by_id(self, tx: Tx, session_pk: int, event_ids: Sequence[str]) -> list[EventRow]:
        out: list[EventRow] = []
        for chunk in chunks(list(event_ids), CHUNK):
            rows = tx.execute(
                select(*EVENT_COLUMNS).where(
                    events.c.session_pk == session_pk, events.c.event_id.in_(chunk)
                )
            ).all()
            out.extend(_event(r) for r in rows)
        missing = set(event_ids) - {e.event_id for e in out if e.event_id is not None}
        if missing:
            out += self._sealed_by_id(tx, session_pk, missing)
        out.sort(key=lambda e: e.version)
        return out

    def _read_payloads(self, tx: Tx, session_pk: int, *, after: int, upto: int) -> list[bytes]:
        """Only the payloads of a range (the fold's fast path)."""
        found = self._fetchcolumn(
            tx, self._q_read_payloads, {"pk": session_pk, "after": after, "upto": upto}
        )
        if len(found) < upto - after:
            # Some are sealed (or missing): the merged read says which.
            return [e.payload for e in self.read_events(tx, session_pk, after=after, upto=upto)]
        return [p if type(p) is bytes else bytes(p) for p in found]

