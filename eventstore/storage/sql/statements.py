"""Every statement both backends share, declared once with SQLAlchemy Core and compiled once per dialect."""

from __future__ import annotations

import inspect
from collections import namedtuple
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from functools import cache
from operator import attrgetter
from typing import Any

from sqlalchemy import (
    Integer,
    LargeBinary,
    and_,
    any_,
    bindparam,
    exists,
    func,
    insert,
    literal,
    literal_column,
    null,
    select,
    tuple_,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.expression import SelectBase
from sqlalchemy.util import memoized_property

from eventstore.core.rows import DIGEST_SIZE, CatalogueEffect, EventRow, SessionRow
from eventstore.storage.catalogue import CATALOGUE_VALUES, effect_params
from eventstore.storage.schema import EVENT_COLUMNS, events, sessions, snapshot_blobs, snapshots

__all__ = [
    "chunks",
    "event_values",
    "event_params",
    "inline",
    "inline_int",
    "head_move_params",
    "Compiled",
    "compiled",
    "shared",
    "dialect_key",
    "insert_events_stmt",
    "read_feed_stmt",
    "read_band_stmt",
    "ordered_blobs_stmt",
    "session_row",
    "upsert_snapshot",
]

# SQLite's default limit is 32766 bound parameters; stay far below it.
CHUNK = 500

EVENT_KEYS = tuple(c.name for c in EVENT_COLUMNS)  # EventRow's field order
#: An event's values (an EventRow, or a row naming the columns) in EventRow's field order.
event_values = attrgetter(*EVENT_KEYS)


def event_params(r: EventRow) -> dict[str, Any]:
    """An event's values by column name (the parameters of an insert into ``events``)."""
    return dict(zip(EVENT_KEYS, event_values(r)))
SESSION_COLS = tuple(sessions.c)
SNAPSHOT_COLS = tuple(snapshots.c)
#: A version above every version a session can have (versions are int4).
MAX_VERSION = 2**31 - 1


def inline(value: int | str, type_: Any) -> Any:
    """A constant written into the statement, not bound: where the planner must see its
    value (a bound `LIMIT $n` is estimated blind), or where a statement is sent as a
    query string of its own with its values inlined. Rendered by SQLAlchemy, untyped in
    the SQL (``'events'``, not ``CAST('events' AS TEXT)``), so the server infers its type."""
    sql = literal(value, type_).compile(compile_kwargs={"literal_binds": True})
    return literal_column(str(sql), type_)


def inline_int(value: int) -> Any:
    """An integer constant written into the statement (see :func:`inline`)."""
    return inline(value, Integer)


def chunks(seq: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Split a long parameter list (SQLite caps bound parameters per statement)."""
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


class Compiled:
    """A Core statement compiled once for one dialect, executed on the DBAPI cursor.

    The hot statements (append, load) skip SQLAlchemy's per-execution work (statement
    construction, cache-key generation, result processing): the SQL is still declared as
    Core, but compiled at start-up. Parameters are passed by name, and rows are read by
    name: :attr:`row` is the named tuple of the statement's result columns (``None``: it
    returns none), or ``row`` given, a named tuple type whose fields must be those columns.
    """

    __slots__ = ("sql", "keys", "defaults", "row")

    def __init__(self, stmt: Any, dialect: Dialect, *, row: type | None = None) -> None:
        c = stmt.compile(dialect=dialect)
        self.sql: str = c.string
        self.keys: tuple[str, ...] | None = tuple(c.positiontup) if c.positional else None
        # Values of literals the statement binds itself (`version > 0`, `LIMIT 1`).
        self.defaults: dict[str, Any] = {
            k: v for k, v in c.params.items() if v is not None
        }
        self.row: Any = _row_type(stmt, row)

    def args(self, params: Mapping[str, Any]) -> Any:
        """The parameters in the driver's style (a tuple for qmark, the mapping for pyformat)."""
        if self.defaults:
            params = {**self.defaults, **params}
        if self.keys is None:
            return params
        return tuple(params[k] for k in self.keys)


# Statements compiled by every store a process opens (the CLI opens one per command, the
# tests thousands): (id of the statement, variant, dialect_key) -> (statement, value).
# The entry holds the statement, so its id is not reused while the entry lives; the
# statements are module constants or built by memoized builders, so this stays small.
_SHARED: dict[tuple[Any, ...], tuple[Any, Any]] = {}
_SCALARS = (str, int, float, bool, type(None), tuple)


def dialect_key(dialect: Dialect) -> tuple[Any, ...]:
    """What of a dialect can change a statement's compiled text: its class (the compiler,
    the class-wide flags) and every attribute set on the instance, by value where it is a
    plain value (paramstyle, server_version_info, flags set at first connect), else by type
    (the identifier preparer, the type compiler), but for SQLAlchemy's memos (values it
    derives from the rest, set by the first compilation). Errs on the side of compiling
    again."""
    attrs = []
    derived = _memoized(type(dialect))
    for k, v in vars(dialect).items():
        if k in derived:
            continue
        if isinstance(v, _SCALARS):
            try:
                hash(v)
            except TypeError:  # a tuple holding a list
                v = repr(v)
            attrs.append((k, v))
        else:
            attrs.append((k, type(v)))
    return (type(dialect), tuple(sorted(attrs)))


@cache
def _memoized(cls: type) -> frozenset[str]:
    """The attributes a dialect class memoizes on its instances (``memoized_property``)."""
    return frozenset(
        k for k in dir(cls) if isinstance(inspect.getattr_static(cls, k, None), memoized_property)
    )


def shared(stmt: Any, dialect: Dialect, variant: Hashable, build: Callable[[], Any]) -> Any:
    """``build()``, made once per process for this statement object, ``variant`` and
    dialect (see :func:`dialect_key`). What ``build`` returns is shared: never mutate it.
    Two threads may both build on a miss; both get a whole value, and the first one kept."""
    key = (id(stmt), variant, dialect_key(dialect))
    hit = _SHARED.get(key)
    if hit is None or hit[0] is not stmt:
        hit = _SHARED.setdefault(key, (stmt, build()))
    return hit[1]


def compiled(stmt: Any, dialect: Dialect, *, row: type | None = None) -> Compiled:
    """``Compiled(stmt, dialect, row=row)``, compiled once per process (see :func:`shared`)."""
    return shared(stmt, dialect, ("compiled", row), lambda: Compiled(stmt, dialect, row=row))


def _row_type(stmt: Any, row: type | None) -> Any:
    """The named tuple type of a statement's rows (see :class:`Compiled`)."""
    if not isinstance(stmt, SelectBase):
        # A write: none of the compiled ones returns rows. (Not asked: the columns a DML
        # statement returns are memoized, and a `.returning()` copy made later keeps them.)
        return row
    names = tuple(stmt.selected_columns.keys())
    if row is None:
        return _named(names)
    if tuple(getattr(row, "_fields", ())) != names:
        raise TypeError(f"{row.__name__} does not name the columns {names}")
    return row


_NAMED: dict[tuple[str, ...], Any] = {}


def _named(names: tuple[str, ...]) -> Any:
    """One named tuple type per tuple of column names."""
    t = _NAMED.get(names)
    if t is None:
        # rename: a column without a name (an unlabelled expression) is read by unpacking.
        t = _NAMED.setdefault(names, namedtuple("Row", names, rename=True))  # type: ignore[misc]
    return t


_P = bindparam

S_GET_SESSION = select(*SESSION_COLS).where(sessions.c.id == _P("id"))
S_GET_SESSION_PK = select(*SESSION_COLS).where(sessions.c.pk == _P("pk"))
S_SET_HEAD = (
    update(sessions)
    .where(sessions.c.pk == _P("p_pk"))
    .values(head=_P("p_head"), head_hash=_P("p_hash"), head_turn=_P("p_turn"))
)
# The version check built into every head move: it matches only if the head is what we
# saw (and the session is still open to writes, ``_OPEN``).
_HEAD_SEEN = (
    sessions.c.pk == _P("p_pk"),
    sessions.c.head == _P("p_old_head"),
    sessions.c.head_hash == _P("p_old_hash"),
)
_OPEN = sessions.c.closed_at.is_(None)
_NEW_HEAD: dict[str, Any] = {
    "head": _P("p_head"),
    "head_hash": _P("p_hash"),
    "head_turn": _P("p_turn"),
}
S_MOVE_HEAD = update(sessions).where(*_HEAD_SEEN, _OPEN).values(**_NEW_HEAD, **CATALOGUE_VALUES)


def head_move_params(
    session_pk: int,
    old_head: int,
    old_hash: bytes,
    last: EventRow,
    head_turn: int,
    effect: CatalogueEffect | None,
) -> dict[str, Any]:
    """The parameters of :data:`S_MOVE_HEAD` (and of the statements built on it): move the
    head of ``session_pk`` from ``old_head`` to the event ``last``, with the catalogue's
    ``effect``."""
    return {
        "p_pk": session_pk,
        "p_old_head": old_head,
        "p_old_hash": old_hash,
        "p_head": last.version,
        "p_hash": last.hash,
        "p_turn": head_turn,
        **effect_params(effect),
    }


@cache
def insert_events_stmt(xact: Any) -> Any:
    """The INSERT of one event row, its columns bound by name and ``xact`` given by the
    dialect's expression (see :meth:`SqlStorage._new_xact`)."""
    values: dict[str, Any] = {c.name: _P(c.name) for c in EVENT_COLUMNS}
    values["xact"] = xact
    return insert(events).values(values)


# The feed: events after a key (xact, session_pk, version), in that order.
_FEED_KEY = tuple_(events.c.xact, events.c.session_pk, events.c.version)
# FeedRow's order: the event's columns, its feed number and session id, then its native
# data (last, so that rows without it keep their shape).
_FEED_COLS = (*EVENT_COLUMNS[:-1], events.c.xact, sessions.c.id.label("session_id"), events.c.native)


@cache
def read_feed_stmt() -> Any:
    """The feed's page after a key, where ``xact`` is unique and the table's own key
    (SQLite): a range scan of the table after ``:x``, each row's session id looked up by
    its key as it goes (already in order: no sort)."""
    return (
        select(*_FEED_COLS)
        .join_from(events, sessions, sessions.c.pk == events.c.session_pk)
        .where(events.c.xact > _P("x"))
        .order_by(events.c.xact)
        .limit(_P("lim"))
    )


@cache
def read_band_stmt(barrier: Any) -> Any:
    """A banded feed's page (PostgreSQL): the rows with ``:x <= xact <= :upto`` after the
    key, cut at ``:lim``, and below ``barrier`` (a SQL expression) — which the statement
    reads itself, in its own snapshot, and returns in the last columns of every row with
    whether committed rows wait at or above it (``pending``).

    The BRIN index on ``xact`` finds the band as a few page ranges; the rows are sorted in
    memory. The barrier is the one row the events are left-joined to, so an empty band
    still returns it (one row of NULL events, sorted last). Session ids are not joined:
    every page would hash and sort them again (the storage keeps them, see
    :meth:`SqlStorage.read_feed`).
    """
    # Materialized, and the band's top computed there: inlined, the barrier's expression
    # would be evaluated again for every row the bitmap scan rechecks.
    x = select(barrier.label("below")).subquery("x")
    top = func.least(_P("upto"), x.c.below - 1)
    waiting = exists().where(events.c.xact >= x.c.below)
    b = select(x.c.below, top.label("top"), waiting.label("pending")).cte("b").prefix_with("MATERIALIZED")
    e = events.c
    return (
        select(*EVENT_COLUMNS[:-1], e.xact, e.native, b.c.below, b.c.pending)
        .select_from(
            b.outerjoin(
                events,
                and_(
                    _FEED_KEY > tuple_(_P("x"), _P("s"), _P("v")),
                    e.xact >= _P("x"),
                    # Implied by the next one, but a bound the index scan can use itself.
                    e.xact <= _P("upto"),
                    e.xact <= b.c.top,
                ),
            )
        )
        .order_by(e.xact, e.session_pk, e.version)
        .limit(_P("lim"))
    )


#: The ids of some sessions, by key.
S_SESSION_IDS = select(sessions.c.pk, sessions.c.id).where(sessions.c.pk == any_(_P("pks")))


# A streaming turn's group-commit step for one session: the same checked head move, also
# checking that the turn still holds the session's lease and renewing it.
_TURN_MOVE = update(sessions).where(*_HEAD_SEEN, sessions.c.writer == _P("p_writer"), _OPEN)
S_TURN_MOVE = _TURN_MOVE.values(**_NEW_HEAD, writer_seen=_P("p_seen"), **CATALOGUE_VALUES)
S_TURN_CLAIM = (
    update(sessions)
    .where(*_HEAD_SEEN, sessions.c.writer.is_(None), _OPEN)
    .values(**_NEW_HEAD, writer=_P("p_writer"), writer_seen=_P("p_seen"), **CATALOGUE_VALUES)
)
S_TURN_MOVE_RELEASE = _TURN_MOVE.values(**_NEW_HEAD, writer=null(), writer_seen=null(), **CATALOGUE_VALUES)
_CONTROL_COLS = (
    sessions.c.pk,
    sessions.c.head,
    sessions.c.head_hash,
    sessions.c.writer,
    sessions.c.writer_seen,
    sessions.c.closed_at,
    sessions.c.closed_reason,
)
WITH_HEAD_EVENT = select(
    *_CONTROL_COLS, events.c.type, events.c.payload, events.c.recorded_at
).select_from(
    sessions.outerjoin(
        events, and_(events.c.session_pk == sessions.c.pk, events.c.version == sessions.c.head)
    )
)
S_CONTROL = select(*_CONTROL_COLS).where(sessions.c.pk == _P("pk"))
S_CONTROL_HEAD = WITH_HEAD_EVENT.where(sessions.c.pk == _P("pk"))
S_READ_PAYLOADS = (
    select(events.c.payload)
    .where(
        events.c.session_pk == _P("pk"),
        events.c.version > _P("after"),
        events.c.version <= _P("upto"),
    )
    .order_by(events.c.version)
)
_RANGE = select(*EVENT_COLUMNS).where(
    events.c.session_pk == _P("pk"),
    events.c.version > _P("after"),
    events.c.version <= _P("upto"),
)
S_READ_EVENTS_ASC = _RANGE.order_by(events.c.version).limit(_P("lim"))
S_READ_EVENTS_DESC = _RANGE.order_by(events.c.version.desc()).limit(_P("lim"))
S_EVENT_AT = select(*EVENT_COLUMNS).where(
    events.c.session_pk == _P("pk"), events.c.version == _P("version")
)
S_SNAPSHOTS_RANGE = (
    select(*SNAPSHOT_COLS)
    .where(
        snapshots.c.session_pk == _P("pk"),
        snapshots.c.version > _P("after"),
        snapshots.c.version <= _P("upto"),
    )
    .order_by(snapshots.c.version)
)


def upsert_snapshot(stmt: Any) -> Any:
    """An INSERT into snapshots (the dialect's, with ON CONFLICT) that replaces a row with
    the same key."""
    return stmt.on_conflict_do_update(
        index_elements=[snapshots.c.session_pk, snapshots.c.version],
        set_={
            "reducer_version": stmt.excluded.reducer_version,
            "rest": stmt.excluded.rest,
            "message_digests": stmt.excluded.message_digests,
        },
    )


@cache
def ordered_blobs_stmt() -> Any:
    """The bodies of the ``n`` digests concatenated in ``md``, one row each, in their order
    (NULL for a missing blob): a recursive CTE counts 0..n-1 and slices the digests."""
    idx = select(literal(0).label("i")).cte("idx", recursive=True)
    idx = idx.union_all(select(idx.c.i + 1).where(idx.c.i + 1 < _P("n")))
    digest = func.substr(_P("md", type_=LargeBinary), idx.c.i * DIGEST_SIZE + 1, DIGEST_SIZE)
    return (
        select(snapshot_blobs.c.body)
        .select_from(idx.outerjoin(snapshot_blobs, snapshot_blobs.c.digest == digest))
        .order_by(idx.c.i)
    )


def session_row(r: Any) -> SessionRow:
    """A session row from a result row that names the columns of ``sessions`` (more may follow)."""
    return SessionRow(
        pk=r.pk,
        id=r.id,
        parent_pk=r.parent_pk,
        fork_version=r.fork_version,
        head=r.head,
        head_hash=bytes(r.head_hash),
        head_turn=r.head_turn,
        baseline=r.baseline,
        baseline_hash=None if r.baseline_hash is None else bytes(r.baseline_hash),
        baseline_turn=r.baseline_turn,
        created_at=r.created_at,
    )

# A blob's reference count (see ``snapshot_blobs.refs``): raised for the blobs a snapshot
# write names without sending (already written in the same transaction, so their rows are
# locked by it), lowered for those a deleted snapshot named.
S_ADD_BLOB_REFS = (
    update(snapshot_blobs)
    .where(snapshot_blobs.c.digest == _P("d"))
    .values(refs=snapshot_blobs.c.refs + _P("n"))
)
S_DROP_BLOB_REFS = (
    update(snapshot_blobs)
    .where(snapshot_blobs.c.digest == _P("d"))
    .values(refs=snapshot_blobs.c.refs - _P("n"))
)
# The blobs a snapshot about to be written over names (their references are released).
S_SNAPSHOT_DIGESTS = select(snapshots.c.message_digests).where(
    snapshots.c.session_pk == _P("pk"), snapshots.c.version == _P("v")
)
