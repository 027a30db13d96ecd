"""The catalogue's SQL statements: kept columns, a page of sessions, the info record.

The columns every head move keeps, a page of sessions, and the ``set_info`` record.

The catalogue columns (``status``, ``first_text``, ``updated_at``) change with the head, in
the statement that moves it (see :mod:`eventstore.core.catalogue` for why the write needs
no fold): :func:`catalogue_values` declares that part of the statement once, and
:data:`CATALOGUE_VALUES` is it fed by the parameters of :func:`effect_params`.

A page (:func:`page`) reads one of the sessions indexes in order from the cursor's key:
``recent`` walks ``(owner,) updated_at DESC, id``, ``created`` ``(owner,) created_at, id``;
the other filters are checked on the rows the scan meets.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    LargeBinary,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from eventstore.core.rows import NO_EFFECT, CatalogueEffect, CatalogueRow
from eventstore.storage.interface import Storage, Tx
from eventstore.storage.schema import events, info_changes, sessions

__all__ = [
    "CATALOGUE_VALUES",
    "EFFECT_TYPES",
    "catalogue_values",
    "effect_params",
    "apply_effect",
    "page",
    "page_query",
    "rows_by_pk",
    "row_by_id",
    "all_rows",
    "set_info",
    "info_changes_of",
    "info_records",
    "restore_info",
    "touch",
    "forget",
]

s = sessions.c

def catalogue_values(effect: Mapping[str, Any]) -> dict[str, Any]:
    """The catalogue part of a head-moving UPDATE of ``sessions`` (SET expressions read the
    old row), given the SQL expressions of the effect's values by the names of
    :func:`effect_params` (its parameters, or the columns a statement reads them from)."""
    return {
        "updated_at": func.coalesce(effect["c_updated"], s.updated_at),
        "status": case(
            (s.first_text.is_not(None), func.coalesce(effect["c_st_u"], s.status)),
            else_=func.coalesce(effect["c_st_n"], s.status),
        ),
        "first_text": case(
            (effect["c_reset"] == 1, effect["c_text"]),
            else_=func.coalesce(s.first_text, effect["c_text"]),
        ),
    }


#: The effect's values as a statement's parameters.
EFFECT_TYPES: dict[str, Any] = {
    "c_updated": BigInteger,
    "c_st_u": Text,
    "c_st_n": Text,
    "c_reset": Integer,
    "c_text": Text,
}
#: The catalogue part of a head-moving UPDATE, fed by :func:`effect_params`.
CATALOGUE_VALUES: dict[str, Any] = catalogue_values(
    {k: bindparam(k, type_=t) for k, t in EFFECT_TYPES.items()}
)


def effect_params(e: CatalogueEffect | None) -> dict[str, Any]:
    """The parameters of :data:`CATALOGUE_VALUES`."""
    e = e or NO_EFFECT
    return {
        "c_updated": e.updated_at,
        "c_st_u": e.status_with_user,
        "c_st_n": e.status_without_user,
        "c_reset": 1 if e.reset else 0,
        "c_text": e.first_text,
    }


def apply_effect(tx: Tx, pk: int, e: CatalogueEffect) -> None:
    """Apply an effect to a session's row on its own (a write that moved the head with a
    statement of its own: the locked append, an import, a rewind)."""
    tx.execute(update(sessions).where(s.pk == pk).values(CATALOGUE_VALUES), effect_params(e))


def carry_info(tx: Tx, from_pk: int, to_pk: int, updated_at: int) -> None:
    """Give the row ``to_pk`` the title, owner and metadata of ``from_pk`` and mark it active
    at ``updated_at`` (a rewind: the session id moves to a new row, the conversation stays)."""
    src = select(s.title, s.owner, s.metadata).where(s.pk == from_pk).subquery()
    tx.execute(
        update(sessions)
        .where(s.pk == to_pk)
        .values(
            title=select(src.c.title).scalar_subquery(),
            owner=select(src.c.owner).scalar_subquery(),
            metadata=select(src.c.metadata).scalar_subquery(),
            updated_at=updated_at,
        )
    )


_ROW_COLS = (
    s.pk,
    s.id,
    s.parent_pk,
    s.fork_version,
    s.head,
    s.baseline,
    s.head_turn,
    s.created_at,
    s.closed_at,
    s.closed_reason,
    s.writer,
    s.writer_seen,
    s.title,
    s.first_text,
    s.owner,
    s.metadata,
    s.updated_at,
    s.status,
    s.line_of,
)


_parent = sessions.alias("parent")


def _listed_cols(interruption: Any) -> tuple[Any, ...]:
    """The row columns plus the parent's id and whether the head event is the
    interruption part: correlated lookups by primary key, per listed row only."""
    e = events.c
    parent_id = select(_parent.c.id).where(_parent.c.pk == s.parent_pk).scalar_subquery()
    interrupted = exists(
        select(literal(1)).where(
            e.session_pk == s.pk,
            e.version == s.head,
            s.head > func.coalesce(s.fork_version, 0),
            e.payload == interruption,
        )
    )
    return (*_ROW_COLS, parent_id.label("parent_id"), interrupted.label("interrupted"))


_LISTED_COLS = _listed_cols(bindparam("interruption", type_=LargeBinary))


def _row(r: Any) -> CatalogueRow:
    # By name: listed rows also carry the parent's id and ``interrupted`` (SQLite: 0 or 1).
    return CatalogueRow(**r._asdict())


def _metadata_match(dialect: str, i: int) -> Any:
    """``sessions.metadata`` holds the key ``mk{i}`` with the JSON value ``mv{i}`` (by
    value: key order and spacing do not matter)."""
    key, value = bindparam(f"mk{i}", type_=Text), bindparam(f"mv{i}", type_=Text)
    if dialect == "postgresql":
        return cast(s.metadata, JSONB)[key] == cast(value, JSONB)
    each = func.json_each(s.metadata).table_valued("key", "type", "value").alias(f"m{i}")
    return exists(
        select(literal(1))
        .select_from(each)
        .where(
            each.c.key == key,
            each.c.type == func.json_type(value),
            or_(each.c.type == "null", each.c.value == func.json_extract(value, "$")),
        )
    )


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def page(tx: Tx | None, storage: Storage, **listing: Any) -> list[CatalogueRow]:
    """Up to ``limit`` sessions of a listing after the keyset position ``after`` (the
    arguments of :func:`page_query`), parent ids and interruptions included: one
    statement, run alone (``storage.fetch_all``) when ``tx`` is ``None``."""
    key, stmt, params = page_query(storage.dialect, **listing)
    if tx is None:
        return [_row(r) for r in storage.fetch_all(key, stmt, params)]
    return [_row(r) for r in tx.execute(stmt, params).all()]


def page_query(
    dialect: str,
    *,
    owner: str | None,
    metadata: Mapping[str, str],
    query: str | None,
    status: str | None,
    order: str,
    include_lines: bool,
    after: tuple[int, str] | None,
    limit: int,
    interruption: bytes = b"",
) -> tuple[tuple[Any, ...], Any, dict[str, Any]]:
    """The SELECT of up to ``limit`` sessions of a listing after ``after``: ``(shape,
    statement, parameters)``; the statement depends on the shape only (and is built once
    per shape).

    Args:
        metadata: key → canonical JSON text of the value.
        query: a lower-cased title substring.
        after: ``(sort time, id)`` of the last session of the previous page.
        interruption: the payload of the interruption part (``interrupted`` compares it).
    """
    params: dict[str, Any] = {"lim": limit, "interruption": interruption}
    if owner is not None:
        params["owner"] = owner
    if status is not None and status != "closed":
        params["status"] = status
    if query:
        params["pattern"] = "%" + _escape_like(query) + "%"
    for i, (k, v) in enumerate(metadata.items()):
        params[f"mk{i}"], params[f"mv{i}"] = k, v
    if after is not None:
        params["t"], params["sid"] = after
    shape = (
        dialect,
        owner is not None,
        include_lines,
        None if status is None else status == "closed",
        bool(query),
        len(metadata),
        after is not None,
        order,
    )
    return shape, _statement(shape), params


@functools.lru_cache(maxsize=256)
def _statement(shape: tuple[Any, ...]) -> Any:
    dialect, by_owner, include_lines, closed, by_query, n_metadata, paged, order = shape
    q = select(*_LISTED_COLS)
    if by_owner:
        q = q.where(s.owner == bindparam("owner", type_=Text))
    if not include_lines:
        q = q.where(s.line_of.is_(None))
    if closed is True:
        q = q.where(s.closed_at.is_not(None))
    elif closed is False:
        q = q.where(s.status == bindparam("status", type_=Text), s.closed_at.is_(None))
    if by_query:
        title = func.lower(func.coalesce(s.title, s.first_text))
        q = q.where(title.like(bindparam("pattern", type_=Text), escape="\\"))
    for i in range(n_metadata):
        q = q.where(_metadata_match(dialect, i))
    t, sid = bindparam("t", type_=BigInteger), bindparam("sid", type_=Text)
    if order == "recent":
        if paged:
            # The first bound is what the index scan starts from; the second drops the
            # entries of the cursor's time up to its id.
            q = q.where(s.updated_at <= t, or_(s.updated_at < t, and_(s.updated_at == t, s.id > sid)))
        q = q.order_by(s.updated_at.desc(), s.id)
    else:
        if paged:
            q = q.where(s.created_at >= t, or_(s.created_at > t, and_(s.created_at == t, s.id > sid)))
        q = q.order_by(s.created_at, s.id)
    return q.limit(bindparam("lim", type_=Integer))


def rows_by_pk(tx: Tx, pks: Sequence[int]) -> dict[int, CatalogueRow]:
    """The catalogue rows of these sessions."""
    if not pks:
        return {}
    return {r.pk: _row(r) for r in tx.execute(select(*_ROW_COLS).where(s.pk.in_(list(pks)))).all()}


def row_by_id(tx: Tx, session_id: str, interruption: bytes = b"") -> CatalogueRow | None:
    """One session's catalogue row (parent id and interruption included), or ``None``."""
    r = tx.execute(
        select(*_LISTED_COLS).where(s.id == session_id), {"interruption": interruption}
    ).first()
    return None if r is None else _row(r)


def all_rows(tx: Tx) -> dict[int, CatalogueRow]:
    """Every session's catalogue row, by pk."""
    return {r.pk: _row(r) for r in tx.execute(select(*_ROW_COLS)).all()}


def set_info(
    tx: Tx,
    pk: int,
    values: Mapping[str, Any],
    *,
    changed_at: int,
    actor: str | None,
    changes: str,
) -> None:
    """Set catalogue columns of one session and record the change (one transaction)."""
    if values:
        tx.execute(update(sessions).where(s.pk == pk).values(dict(values)))
    tx.execute(
        insert(info_changes).values(session_pk=pk, changed_at=changed_at, actor=actor, changes=changes)
    )


def info_changes_of(tx: Tx, pk: int) -> list[tuple[int, str | None, str]]:
    """``(changed_at, actor, changes)`` of every recorded ``set_info`` of a session, oldest first."""
    c = info_changes.c
    rows = tx.execute(
        select(c.changed_at, c.actor, c.changes).where(c.session_pk == pk).order_by(c.id)
    ).all()
    return [(int(a), b, str(d)) for a, b, d in rows]


def info_records(tx: Tx, pks: Sequence[int] | None = None) -> list[tuple[int, int, str | None, str]]:
    """``(session_pk, changed_at, actor, changes)`` of the recorded ``set_info`` calls of the
    rows ``pks`` (``None``: of every row), in the order they were made."""
    c = info_changes.c
    q = select(c.session_pk, c.changed_at, c.actor, c.changes).order_by(c.id)
    if pks is not None:
        q = q.where(c.session_pk.in_(list(pks)))
    return [(int(p), int(a), b, str(d)) for p, a, b, d in tx.execute(q).all()]


def restore_info(
    tx: Tx, pk: int, values: Mapping[str, Any], changes: Sequence[tuple[int, str | None, str]]
) -> None:
    """Set a row's ``set_info`` columns and insert its change records as given (an import)."""
    tx.execute(update(sessions).where(s.pk == pk).values(dict(values)))
    for at, actor, what in changes:
        tx.execute(insert(info_changes).values(session_pk=pk, changed_at=at, actor=actor, changes=what))


def touch(tx: Tx, pk: int, at: int) -> None:
    """Raise a row's ``updated_at`` to ``at`` (never lower it)."""
    tx.execute(update(sessions).where(s.pk == pk, s.updated_at < at).values(updated_at=at))


def forget(tx: Tx, pks: Sequence[int]) -> None:
    """Delete the info change records of erased sessions (they hold titles)."""
    if pks:
        tx.execute(info_changes.delete().where(info_changes.c.session_pk.in_(list(pks))))
