"""Rewinds: the session row renamed and replaced, and the audit record (SQLAlchemy Core).

A rewind renames the rewound session's row, inserts the row that takes its id and the
audit record, in the caller's transaction; no event row is read or written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from sqlalchemy import insert, select, update

from eventstore.core.rows import NewSession, RewindRow, SessionRow
from eventstore.errors import StorageError
from eventstore.storage.interface import Tx
from eventstore.storage.schema import session_rewinds, sessions
from eventstore.storage.sql.transactions import SqlTransactions

__all__ = ["Rewinds", "keep_line", "mark_line", "record_rewind", "select_rewinds"]


def keep_line(tx: Any, pk: int, kept_id: str, closed_at: int, reason: str) -> None:
    """Rename row ``pk`` to ``kept_id`` and close it to writes (its id is then free)."""
    tx.execute(
        update(sessions)
        .where(sessions.c.pk == pk)
        .values(id=kept_id, closed_at=closed_at, closed_reason=reason)
    )


def mark_line(tx: Any, pk: int, line_of: int) -> None:
    """Mark row ``pk`` as a line kept from the session whose new row is ``line_of``."""
    tx.execute(update(sessions).where(sessions.c.pk == pk).values(line_of=line_of))


def record_rewind(tx: Any, rec: RewindRow) -> None:
    """Insert the audit record of a rewind."""
    values = {c.name: getattr(rec, c.name) for c in session_rewinds.c if c.name != "seq"}
    tx.execute(insert(session_rewinds).values(values))


def select_rewinds(
    tx: Any, *, session_id: str | None = None, pks: Collection[int] | None = None
) -> list[RewindRow]:
    """Rewind records, oldest first: of one session id, or whose kept or new row is one of
    ``pks``, or (neither given) all."""
    q = select(*session_rewinds.c).order_by(session_rewinds.c.seq)
    if session_id is not None:
        q = q.where(session_rewinds.c.session_id == session_id)
    if pks is not None:
        chosen = list(pks)
        q = q.where(session_rewinds.c.kept_pk.in_(chosen) | session_rewinds.c.new_pk.in_(chosen))
    return [
        RewindRow(
            session_id=r["session_id"],
            kept_id=r["kept_id"],
            kept_pk=r["kept_pk"],
            new_pk=r["new_pk"],
            from_head=r["from_head"],
            from_hash=bytes(r["from_hash"]),
            to_version=r["to_version"],
            rewound_at=r["rewound_at"],
            actor=r["actor"],
            reason=r["reason"],
            seq=r["seq"],
        )
        for r in tx.execute(q).mappings()
    ]


class Rewinds(SqlTransactions):
    """A rewind, its undo (a restore), and the records of both."""

    def rewind_session(
        self,
        tx: Tx,
        rec: RewindRow,
        *,
        closed_at: int,
        reason: str,
        new: NewSession | None = None,
    ) -> SessionRow | None:
        keep_line(tx, rec.kept_pk, rec.kept_id, closed_at, reason)
        if new is None:  # a restore: the line that took the id is there already
            mark_line(tx, rec.kept_pk, rec.new_pk)
            record_rewind(tx, rec)
            return None
        row = self.insert_session(tx, new)
        if row is None:
            raise StorageError(f"session id {new.id!r} is taken; it cannot take the rewound session")
        mark_line(tx, rec.kept_pk, row.pk)
        record_rewind(tx, dataclasses.replace(rec, new_pk=row.pk))
        return row
