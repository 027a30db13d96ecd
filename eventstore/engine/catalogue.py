"""The conversations catalogue: what a chat app's sidebar needs, over the engine.

Engine calls over the catalogue's statements:

- :func:`set_info` sets a session's title, owner and info metadata — outside the log (no
  event, the head does not move), each call recorded in ``info_changes`` (who, when, what);
- :func:`list_sessions` pages through sessions by owner, metadata, title, status and time,
  one index scan per page (see :mod:`eventstore.storage.catalogue`);
- :func:`info` / :func:`info_changes` read one session's entry and its change record;
  :func:`all_info_changes` the change records ``verify`` reports;
- :func:`rows_by_pk`, :func:`info_records`, :func:`restore_info` and :func:`touch` are
  what an export reads and an import writes back, in the caller's transaction.

The columns a listing sorts and filters on are kept by every write that moves a head (see
:mod:`eventstore.core.catalogue`), so nothing here folds a session.
"""

from __future__ import annotations

from typing import Any

from eventstore.core.catalogue import (
    InfoChange,
    SessionPage,
    catalogue_fields,
    check_listing,
    check_metadata,
    check_title,
    encode_cursor,
    name_info_changes,
)
from eventstore.core.codec import canonical
from eventstore.core.records import SessionInfo, to_datetime
from eventstore.core.rows import CatalogueRow, RewindRow, SessionControl
from eventstore.core.turn_rules import INTERRUPTION, session_info
from eventstore.engine.engine import Engine
from eventstore.engine.transaction_steps import now_micros
from eventstore.storage import catalogue as rows

__all__ = [
    "set_info",
    "list_sessions",
    "info",
    "info_changes",
    "all_info_changes",
    "rows_by_pk",
    "info_records",
    "restore_info",
    "touch",
]


def set_info(
    engine: Engine,
    session: Any,
    *,
    title: Any = None,
    owner: Any = None,
    metadata: Any = None,
    actor: Any = None,
) -> SessionInfo:
    """Set a session's catalogue fields (see :meth:`eventstore.EventStore.set_info`)."""
    v = engine.validate
    v.id(session, "session")
    title = check_title(title)
    if owner is not None:
        owner = v.id(owner, "owner")
    meta = check_metadata(metadata)
    v.optional_id(actor, "actor")
    values: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    if title is not None:
        values["title"] = title or None
        changes["title"] = title
    if owner is not None:
        values["owner"] = changes["owner"] = owner
    if meta is not None:
        values["metadata"] = canonical(meta).decode() if meta else None
        changes["metadata"] = meta
    st = engine.storage
    with st.write() as tx:
        row = st.session(tx, id=session, lock=True)
        if row is None:
            raise engine.missing(tx, session)
        if changes:
            rows.set_info(
                tx,
                row.pk,
                values,
                changed_at=now_micros(),
                actor=actor,
                changes=canonical(changes).decode(),
            )
    return info(engine, session)


#: What the event at an interrupted session's head holds (see ``interrupted``).
_INTERRUPTION = canonical(INTERRUPTION)


def _infos(found: list[CatalogueRow]) -> list[SessionInfo]:
    return [
        session_info(
            SessionControl(
                r.pk, r.head, b"", r.writer, r.writer_seen, r.closed_at, r.closed_reason,
                head_payload=_INTERRUPTION if r.interrupted else None,
            ),
            id=r.id,
            parent=r.parent_id,
            fork_version=r.fork_version,
            head=r.head,
            baseline=r.baseline,
            created_at=to_datetime(r.created_at),
            head_turn=r.head_turn,
            **catalogue_fields(r),
        )
        for r in found
    ]


def info(engine: Engine, session: Any) -> SessionInfo:
    """One session's catalogue entry (see :meth:`eventstore.EventStore.info`)."""
    engine.validate.id(session, "session")
    with engine.storage.read() as tx:
        row = rows.row_by_id(tx, session, _INTERRUPTION)
        if row is None:
            raise engine.missing(tx, session)
    return _infos([row])[0]


def info_changes(engine: Engine, session: Any) -> list[InfoChange]:
    """Every recorded ``set_info`` of a session, oldest first.

    A rewind moves the session id to a new row; the changes made to the id before it
    (recorded on the row now kept) stay the session's. A kept line's own record holds
    both: the changes made before its rewind (under the session's id) and after.
    """
    engine.validate.id(session, "session")
    st = engine.storage
    with st.read() as tx:
        row = rows.row_by_id(tx, session)
        if row is None:
            raise engine.missing(tx, session)
        held = st.records(tx, RewindRow, session_id=session)
        own = st.records(tx, RewindRow, pks=[row.pk])
        records = rows.info_records(tx, [row.pk, *(r.kept_pk for r in held)])
        names = {r.kept_pk: r.kept_id for r in held} | {row.pk: session}
        found = name_info_changes(records, names, [*held, *own])
    return [c for c, rec in zip(found, records) if rec[0] == row.pk or c.session == session]


def all_info_changes(engine: Engine, tx: Any, pks: Any = None) -> list[InfoChange]:
    """The recorded ``set_info`` calls of the rows ``pks`` (``None``: every row), each under
    the id it was made to, oldest first (the audit trail ``verify`` reports)."""
    st = engine.storage
    records = rows.info_records(tx, pks)
    names = {r.pk: r.id for r in st.sessions(tx)}
    return name_info_changes(
        [r for r in records if r[0] in names], names, st.records(tx, RewindRow, pks={r[0] for r in records})
    )


def list_sessions(engine: Engine, **filters: Any) -> SessionPage:
    """One page of the catalogue; ``filters`` are every keyword argument of
    :meth:`eventstore.EventStore.list_sessions`, checked by :func:`check_listing`."""
    listing = check_listing(engine.validate.id, **filters)
    found = rows.page(
            None,
            engine.storage,
            owner=listing.owner,
            metadata={k: canonical(val).decode() for k, val in listing.metadata.items()},
            query=listing.query,
            status=listing.status,
            order=listing.order,
            include_lines=listing.include_lines,
            after=listing.after,
            limit=listing.limit + 1,
            interruption=_INTERRUPTION,
    )
    more = len(found) > listing.limit
    found = found[: listing.limit]
    items = _infos(found)
    next_cursor = None
    if more and found:
        last = found[-1]
        key = last.updated_at if listing.order == "recent" else last.created_at
        next_cursor = encode_cursor(listing, (key, last.id))
    return SessionPage(items, next_cursor)


def rows_by_pk(tx: Any, pks: list[int]) -> dict[int, CatalogueRow]:
    """The catalogue rows of sessions, by pk (in the caller's transaction)."""
    return rows.rows_by_pk(tx, pks)


def info_records(tx: Any, pks: list[int] | None) -> list[tuple[int, int, str | None, str]]:
    """``(session_pk, changed_at, actor, changes JSON)`` of the rows' ``set_info`` calls,
    in the order they were made."""
    return rows.info_records(tx, pks)


def restore_info(
    tx: Any,
    pk: int,
    *,
    title: str | None,
    owner: str | None,
    metadata: str | None,
    changes: list[tuple[int, str | None, str]],
) -> None:
    """Give an imported row the title, owner and metadata (canonical JSON text) it had,
    and the record of the ``set_info`` calls that set them (``(changed_at, actor,
    changes JSON)``, oldest first)."""
    rows.restore_info(tx, pk, {"title": title, "owner": owner, "metadata": metadata}, changes)


def touch(tx: Any, pk: int, at: int) -> None:
    """Make ``at`` a row's last activity if it is newer than what the row says (an imported
    rewind counts as activity of the row it made)."""
    rows.touch(tx, pk, at)
