"""PostgreSQL's own statements: the one-round-trip appends and load, the feed's barrier and channel."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Integer,
    LargeBinary,
    Text,
    bindparam,
    case,
    cast,
    exists,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import OID, aggregate_order_by, array_agg
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect

from eventstore.core.rows import DIGEST_SIZE
from eventstore.storage.catalogue import EFFECT_TYPES, catalogue_values
from eventstore.storage.postgres.feed_barrier import writers_barrier
from eventstore.storage.schema import EVENT_COLUMNS, event_segments, events, sessions, snapshot_blobs, snapshots
from eventstore.storage.sql.statements import S_MOVE_HEAD, Compiled, inline, inline_int, shared, upsert_snapshot

__all__ = [
    "feed_xact",
    "SEAL_CALL",
    "feed_channel",
    "NOTIFY",
    "append_stmt",
    "append_batches_stmt",
    "compile_hot",
    "load_stmt",
    "BAND_SETTINGS",
    "set_config",
    "MIGRATION_LOCK",
    "snapshot_xmin",
    "feed_barrier_stmt",
]

# pg_advisory_xact_lock key for migrations: crc32(b"eventstore-migrate").
MIGRATION_LOCK = 0x4E5F_7A31

_P = bindparam


def _bytea(text: str) -> Any:
    """A bytea constant written into the statement (``'text'::bytea``)."""
    return cast(inline(text, Text), LargeBinary)
_PG = psycopg_dialect()


def feed_xact() -> Any:
    """The default of ``events.xact`` (revision 0003): the writing transaction's id. It is
    the key of the feed's visibility barrier: a transaction's id is assigned before it
    commits, so rows below the oldest transaction that can still write one are all
    committed and no row can ever be added below it again."""
    return cast(cast(func.pg_current_xact_id(), Text), BigInteger)


#: The channel followers listen on, for the events table the search path finds: it names
#: the table by its OID, so stores on different schemas of one server wake only their own.
_FEED_CHANNEL = select(
    literal("eventstore_", Text).concat(
        cast(cast(func.to_regclass(literal("events", Text)), OID), Text)
    ).label("channel")
)


#: The signal that wakes followers, compiled once for libpq's asynchronous calls (``$1``:
#: the channel), which the notifier sends without psycopg's cursor (see NotifySignal).
NOTIFY = Compiled(
    select(func.pg_notify(_P("channel", type_=Text), inline("", Text))),
    psycopg_dialect(paramstyle="numeric_dollar"),
)


def feed_channel() -> str:
    """The statement that names the notification channel of this schema's events table
    (its text, for psycopg connections of their own)."""
    return _literal_sql(_FEED_CHANNEL)


def _literal_sql(stmt: Any) -> str:
    """A statement without parameters, its values inlined (a query string on its own)."""
    return str(stmt.compile(dialect=_PG, compile_kwargs={"literal_binds": True}))


def set_config(name: str, value: str, *, local: bool = False) -> str:
    """The statement that sets a server setting (``local``: until the transaction ends, as
    SET LOCAL does), as a query string of its own."""
    return _literal_sql(select(func.set_config(literal(name, Text), literal(value, Text), local)))


# The session key of a hot statement, for its scans of `events` and `snapshots`: on
# partitioned tables a key known when the execution starts lets the executor prune the
# other partitions then, where a key read from another row of the statement leaves the
# cached generic plan to set up a scan of every partition and choose at run time. It is
# the parameter plus a zero the planner cannot fold (now() is STABLE) on purpose: a bare
# parameter is pruned on at plan time in each custom plan, which then looks far cheaper
# than the generic one, and PostgreSQL re-plans the statement on every execution (slower
# than the run-time pruning it replaces); a stable expression is pruned on only at
# executor start-up, both plans cost the same, and the cached generic plan is used.
def _key(name: str) -> Any:
    """The session key parameter ``name``, plus the zero the planner cannot fold."""
    return _P(name, type_=Integer) + cast(func.now().is_(None), Integer)


def _arrays(name: str, **columns: Any) -> Any:
    """``unnest`` of one array parameter per column (``column=(parameter, element type)``),
    as the table ``name`` with those columns."""
    arrays = [_P(p, type_=ARRAY(t)) for p, t in columns.values()]
    return func.unnest(*arrays).table_valued(*columns).render_derived(name=name)


def _feed_xact(pk: Any, old_head: Any) -> Any:
    """An inserted event's feed number: the transaction's id, raised to the session's
    previous event's (see eventstore/core/feed_rules.py)."""
    p = events.alias("p")
    prev = select(p.c.xact).where(p.c.session_pk == pk, p.c.version == old_head)
    return func.greatest(feed_xact(), prev.scalar_subquery())


def _snapshot_writes(moved: Any, keyed: bool) -> tuple[Any, Any]:
    """The blob and snapshot inserts of an append, for the sessions in ``moved``: from
    arrays of one session's (``keyed=False``) or with each element's session key."""
    b = _arrays(
        "n",
        **({"pk": ("b_pks", Integer)} if keyed else {}),
        digest=("b_digests", LargeBinary),
        body=("b_bodies", LargeBinary),
        refs=("b_refs", Integer),
    )
    # Each blob with the references this batch's snapshots add (see snapshot_blobs.refs),
    # in digest order (the client sorts one session's): the conflict locks a stored blob's
    # row, so a blob collection waits for this commit or, having deleted it first, makes
    # this insert store it again. Two sessions of a group may send the same blob: one row.
    blobs = select(b.c.digest, b.c.body, b.c.refs)
    n = _arrays(
        "n",
        **({"pk": ("s_pks", Integer)} if keyed else {}),
        version=("s_versions", Integer),
        reducer_version=("s_reducers", Integer),
        rest=("s_rests", LargeBinary),
        message_digests=("s_digests", LargeBinary),
    )
    snaps = select(
        n.c.pk if keyed else moved.c.pk, n.c.version, n.c.reducer_version, n.c.rest, n.c.message_digests
    )
    if keyed:
        blobs = (
            select(
                b.c.digest, array_agg(b.c.body)[inline_int(1)], cast(func.sum(b.c.refs), Integer)
            )
            .where(b.c.pk.in_(select(moved.c.pk)))
            .group_by(b.c.digest)
            .order_by(b.c.digest)
        )
        snaps = snaps.where(n.c.pk.in_(select(moved.c.pk)))
    else:
        blobs = blobs.select_from(moved).join(b, true())
        snaps = snaps.select_from(moved).join(n, true())
    new_blobs = pg_insert(snapshot_blobs).from_select(["digest", "body", "refs"], blobs)
    new_blobs = new_blobs.on_conflict_do_update(
        index_elements=[snapshot_blobs.c.digest],
        set_={"refs": snapshot_blobs.c.refs + new_blobs.excluded.refs},
    )
    new_snapshots = pg_insert(snapshots).from_select(
        ["session_pk", "version", "reducer_version", "rest", "message_digests"], snaps
    )
    return new_blobs.cte("blobs"), upsert_snapshot(new_snapshots).cte("snaps")


_EVENT_INSERT = [c.name for c in EVENT_COLUMNS[:-1]] + ["xact"]
#: The arrays of an append's events both append statements take (``column=(parameter,
#: element type)``, see :func:`_arrays`).
_EVENT_ARRAYS: dict[str, tuple[str, Any]] = {
    "version": ("e_versions", Integer),
    "event_id": ("e_ids", Text),
    "type": ("e_types", Text),
    "turn": ("e_turns", Integer),
    "payload": ("e_payloads", LargeBinary),
    "hash": ("e_hashes", LargeBinary),
}


def _event_values(event: Mapping[str, Any], xact: Any) -> list[Any]:
    """An inserted event's values in :data:`_EVENT_INSERT`'s order: its columns' from
    ``event`` (by column name), then its feed number."""
    return [event[c] for c in _EVENT_INSERT[:-1]] + [xact]


@cache
def append_stmt(*, rows: bool, snapshots: bool) -> Any:
    """PostgreSQL's append of one session's batch: one statement, one round trip, its own
    transaction (run in autocommit).

    It moves the head only if it is still what the writer saw (the shared head move,
    :data:`S_MOVE_HEAD`, with its version check; the UPDATE takes the session's row lock),
    inserts the events and stores the snapshots the batch reaches with the message blobs
    they add. Every insert selects FROM moved, so nothing at all is written when the head
    had moved on. The variants: ``rows``, the events from arrays (one ``recorded_at``,
    ``actor`` and ``metadata`` for all), returning how many were inserted; else one event
    from scalar parameters, whose row count says whether it was (array parameters cost
    the client ~0.1 ms per statement to adapt, more than the insert itself: most appends
    of a streamed reply are that one); ``snapshots``, with the snapshot parts.
    """
    moved = S_MOVE_HEAD.returning(sessions.c.pk).cte("moved")
    xact = _feed_xact(_key("p_pk"), _P("p_old_head", type_=Integer))
    shared = {
        "recorded_at": _P("recorded_at", type_=BigInteger),
        "actor": _P("actor", type_=Text),
        "metadata": cast(_P("metadata", type_=LargeBinary), LargeBinary),  # typed: it may be NULL
    }
    if not rows:
        one = {
            "version": _P("p_head", type_=Integer),
            "event_id": _P("event_id", type_=Text),
            "type": _P("type", type_=Text),
            "turn": _P("p_turn", type_=Integer),
            "payload": _P("payload", type_=LargeBinary),
            "hash": _P("p_hash", type_=LargeBinary),
        }
        values = _event_values({**one, **shared, "session_pk": moved.c.pk}, xact)
        assert not snapshots, "one event from scalars has no snapshot parts"
        return insert(events).from_select(_EVENT_INSERT, select(*values).select_from(moved)).add_cte(moved)
    u = _arrays("u", **_EVENT_ARRAYS)
    values = _event_values({**u.c, **shared, "session_pk": moved.c.pk}, xact)
    each = select(*values).select_from(moved).join(u, true())
    ins = insert(events).from_select(_EVENT_INSERT, each).returning(inline_int(1)).cte("ins")
    stmt = select(func.count()).select_from(ins)
    return stmt.add_cte(*_snapshot_writes(moved, keyed=False)) if snapshots else stmt


@cache
def append_batches_stmt() -> Any:
    """A group commit of batches (streaming turns', or the async store's plain appends) in
    one statement, one round trip, its own transaction: :func:`append_stmt` for many
    sessions, each batch's values from arrays (``b``).

    Each session's head moves only if it is still what its batch saw, the turn still holds
    the lease (or claims it: nobody does) and the session is open, renewing or giving up
    the lease; a batch without a writer leaves the lease alone. Then the events and
    snapshots of the sessions that moved are inserted. Returns the keys that moved.
    """
    s = sessions.c
    b = select(
        _arrays(
            "b",
            pk=("pks", Integer),
            old_head=("old_heads", Integer),
            old_hash=("old_hashes", LargeBinary),
            writer=("writers", Text),
            head=("heads", Integer),
            hash=("hashes", LargeBinary),
            turn=("turns", Integer),
            release=("releases", Boolean),
            claim=("claims", Boolean),
            **{k: (k, t) for k, t in EFFECT_TYPES.items()},
        )
    ).cte("b")
    plain = b.c.writer.is_(None)
    moved = (
        update(sessions)
        .where(
            s.pk == b.c.pk,
            s.head == b.c.old_head,
            s.head_hash == b.c.old_hash,
            case((plain, true()), (b.c.claim, s.writer.is_(None)), else_=s.writer == b.c.writer),
            s.closed_at.is_(None),
        )
        .values(
            head=b.c.head,
            head_hash=b.c.hash,
            head_turn=b.c.turn,
            writer=case((plain, s.writer), (b.c.release, null()), else_=b.c.writer),
            writer_seen=case(
                (plain, s.writer_seen), (b.c.release, null()), else_=_P("seen", type_=BigInteger)
            ),
            **catalogue_values({k: b.c[k] for k in EFFECT_TYPES}),
        )
        .returning(s.pk)
        .cte("moved")
    )
    u = _arrays(
        "u",
        pk=("e_pks", Integer),
        **_EVENT_ARRAYS,
        recorded_at=("e_times", BigInteger),
        actor=("e_actors", Text),
        metadata=("e_metas", LargeBinary),
        native=("e_natives", LargeBinary),
    )
    values = _event_values({**u.c, "session_pk": u.c.pk}, _feed_xact(u.c.pk, b.c.old_head))
    each = (
        select(*values, u.c.native)
        .select_from(u)
        .join(b, b.c.pk == u.c.pk)
        .where(u.c.pk.in_(select(moved.c.pk)))
    )
    ins = insert(events).from_select([*_EVENT_INSERT, "native"], each).cte("ins")
    done = select(func.coalesce(func.array_agg(moved.c.pk), inline("{}", Text)))
    return done.add_cte(ins, *_snapshot_writes(moved, keyed=True))


def compile_hot(stmt: Any, dialect: Any) -> Compiled:
    """A hot statement compiled once, its bytes and arrays sent in binary (psycopg's
    ``%b``): psycopg's text quoting of a hundred bytea elements costs milliseconds."""
    q: Compiled = shared(stmt, dialect, "hot", lambda: _compile_hot(stmt, dialect))
    return q


def _compile_hot(stmt: Any, dialect: Any) -> Compiled:
    # Changed here, before it is shared (see shared).
    q = Compiled(stmt, dialect)
    for name, bind in stmt.compile(dialect=dialect).binds.items():
        if isinstance(bind.type, (LargeBinary, ARRAY)):
            q.sql = q.sql.replace(f"%({name})s", f"%({name})b")
    return q


def snapshot_xmin() -> Any:
    """The oldest transaction that can still write an event, in the statement's snapshot:
    every row below it is committed for good, and no row can be added below it any more.
    Not the cluster's oldest transaction: a stranger's must not hold the feed (see
    :mod:`eventstore.storage.postgres.feed_barrier`)."""
    return writers_barrier()


# Sealing one closed turn through the owner's function (migration 0011 defines it).
SEAL_CALL = select(
    func.eventstore_seal(
        bindparam("pk"),
        bindparam("first"),
        bindparam("last"),
        bindparam("prev", type_=LargeBinary()),
        bindparam("body", type_=LargeBinary()),
    )
)

#: A band is always an index range, but the planner knows it only from statistics: on a
#: table not analysed yet it would read the whole table for every page.
BAND_SETTINGS = set_config("enable_seqscan", "off", local=True)


@cache
def feed_barrier_stmt() -> Any:
    """The barrier, and whether committed rows wait at or above it — in one snapshot."""
    b = select(snapshot_xmin().label("below")).subquery("b")
    return select(b.c.below, exists().where(events.c.xact >= b.c.below).label("pending"))


# A root session's load in one round trip: the session row, its newest usable snapshot
# at or below the version (made by this reducer, or the compaction baseline whatever its
# reducer), the snapshot's stored blobs as an array in its order (the digests are split
# with generate_series; the codec compressed them, so the server sends them as stored, a
# fifth of the state's bytes), and the tail payloads joined in version order. Python then
# unpacks the blobs and parses two JSON arrays. Branches get only their row (the lineage is
# read the general way). LATERAL joins rather than CTEs: cheaper to plan, which is most of
# a cold load's server time. Its constants are inlined (:func:`_int`), as the statement
# was planned with them: a parameter in their place (`LIMIT $n`) is estimated blind.
@cache
def load_stmt(*, by_key: bool) -> Any:
    """The head load (see above); ``by_key``: with the session's key given as well, when
    the storage knows it (see :func:`_key`): the partitions of other sessions are pruned
    when the execution starts."""
    s = sessions.alias("s")
    key = _key("pk") if by_key else s.c.pk
    root = s.c.parent_pk.is_(None)
    upto = func.coalesce(_P("version", type_=Integer), s.c.head)
    x = snapshots.alias("x")
    n = (
        select(
            x.c.version,
            x.c.rest,
            # `|| ''` detoasts the digests once, here, not once per message in the split below.
            x.c.message_digests.concat(_bytea("")).label("md"),
        )
        .where(
            x.c.session_pk == key,
            root,
            x.c.version > inline_int(0),
            x.c.version <= upto,
            or_(x.c.reducer_version == _P("rv"), x.c.version == s.c.baseline),
        )
        .order_by(x.c.version.desc())
        .limit(inline_int(1))
        .lateral("n")
    )
    # One index probe per digest, as a scalar subquery: a join here may be planned as a
    # hash join over every blob of every session.
    g = func.generate_series(inline_int(0), func.length(n.c.md, type_=Integer) // inline_int(DIGEST_SIZE) - inline_int(1))
    g = g.table_valued("i").render_derived(name="g")
    b = snapshot_blobs.alias("b")
    part = func.substring(n.c.md, g.c.i * inline_int(DIGEST_SIZE) + inline_int(1), inline_int(DIGEST_SIZE))
    body = select(b.c.body).where(b.c.digest == part).correlate_except(b).scalar_subquery()
    # OFFSET 0 keeps the subquery from being inlined twice, into both aggregates.
    c = select(g.c.i, body.label("body")).offset(inline_int(0)).subquery("c")
    m = select(
        func.array_agg(aggregate_order_by(c.c.body, c.c.i)).label("bodies"),
        func.count().label("n_digests"),
        func.count(c.c.body).label("n_found"),
    ).lateral("m")
    e = events.alias("e")
    comma = _bytea(",")
    t = (
        select(
            func.string_agg(e.c.payload, aggregate_order_by(comma, e.c.version)).label("payloads"),
            func.count().label("n"),
        )
        .where(
            root,
            e.c.session_pk == key,
            e.c.version > func.coalesce(n.c.version, inline_int(0)),
            e.c.version <= upto,
        )
        .lateral("t")
    )
    # The sealed segments the tail crosses, as one array per column in version order: only
    # when the rows fall short of the tail (a one-time filter: a session without sealed
    # turns in its tail probes nothing), so a checkout needs no second round trip for them.
    sg = event_segments.alias("sg")
    after = func.coalesce(n.c.version, inline_int(0))
    gs = select(
        *(
            func.array_agg(aggregate_order_by(col, sg.c.first_version)).label(f"g_{col.name}")
            for col in (
                sg.c.first_version, sg.c.last_version, sg.c.prev_hash, sg.c.end_hash,
                sg.c.xact_digest, sg.c.min_xact, sg.c.max_xact, sg.c.body,
            )
        )
    ).where(
        root,
        t.c.n < upto - after,
        sg.c.session_pk == key,
        sg.c.last_version > after,
        sg.c.first_version <= upto,
    ).lateral("gs")
    stmt = (
        select(
            s.c.pk, s.c.id, s.c.parent_pk, s.c.fork_version, s.c.head, s.c.head_hash,
            s.c.head_turn, s.c.baseline, s.c.baseline_hash, s.c.baseline_turn, s.c.created_at,
            n.c.version, n.c.rest, m.c.bodies, m.c.n_digests, m.c.n_found, t.c.payloads, t.c.n,
            *gs.c,
        )
        .select_from(
            s.outerjoin(n, true()).outerjoin(m, true()).outerjoin(t, true()).outerjoin(gs, true())
        )
        .where(s.c.id == _P("id"))
    )
    return stmt.where(s.c.pk == _P("pk", type_=Integer)) if by_key else stmt
