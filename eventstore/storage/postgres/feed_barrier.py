"""PostgreSQL: the feed's barrier — the oldest transaction that can still add an event below it.

Every event row carries the id of the transaction that wrote it (``events.xact``), and ids
are assigned before their transactions commit, so the feed reads only rows below a barrier
that no later commit can write under (see :mod:`eventstore.core.feed_rules`). The oldest
transaction of the whole cluster (``pg_snapshot_xmin``) is such a barrier, but then anyone
who can connect anywhere on the cluster holds every feed back with one open transaction
(``BEGIN; SELECT pg_current_xact_id();`` in another database, under a role with no
privilege), and so does any idle-in-transaction session of any application.

The barrier here is the oldest transaction that *can still write an event*: one that holds
a lock on this database's ``events`` table (or a partition of it) or on ``sessions``.
Locks on a table are taken before a statement touches it and held until the transaction
ends, and every writer of the store takes its transaction id in a statement on ``sessions``
or ``events`` (moving or creating a session's head, inserting events); so a transaction
running without such a lock has never written an event, and any it writes later gets an id
above the barrier... unless it took its id elsewhere first. A transaction that writes
events by hand must therefore touch ``events`` or ``sessions`` before anything else that
takes an id; the store's own transactions do.

The statement reads, in one snapshot of its own:

- the snapshot's running transactions (``pg_snapshot_xip``) and its ``xmax`` (ids from
  there on were not yet assigned, or are treated as running by the snapshot: the barrier
  never exceeds it);
- ``pg_locks`` (readable by every role), once, materialized: which running transaction ids
  belong to which virtual transaction, and which virtual transactions hold a lock on this
  database's ``events`` (and partitions) or ``sessions``.

A running id is passed over only when ``pg_locks`` shows it held by a transaction with no
such lock *and* ``pg_xact_status`` still calls it in progress after ``pg_locks`` was read
(the ``CASE`` orders the two): a transaction that committed after our snapshot may already
have dropped its table locks but not its id's, and its rows, invisible to this snapshot,
must not be passed over. An id ``pg_locks`` does not show (it ended meanwhile) is kept: the
barrier is conservative, never ahead.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Text, and_, case, cast, column, exists, func, or_, select, table, true, union_all
from sqlalchemy.dialects.postgresql import OID, REGCLASS

from eventstore.storage.sql.statements import inline

__all__ = ["writers_barrier"]

_pg_locks = table(
    "pg_locks",
    column("locktype", Text),
    column("transactionid"),
    column("virtualtransaction", Text),
    column("granted"),
    column("database", OID),
    column("relation", OID),
)
_pg_inherits = table("pg_inherits", column("inhrelid", OID), column("inhparent", OID))
_pg_database = table("pg_database", column("oid", OID), column("datname", Text))


def _regclass(name: str) -> Any:
    """A table's OID by its name on the search path (resolved when the statement is
    parsed, as ``'name'::regclass`` is)."""
    return cast(inline(name, Text), REGCLASS)


def _bigint(xid: Any) -> Any:
    """A transaction id (xid8) as a bigint."""
    return cast(cast(xid, Text), BigInteger)


def writers_barrier() -> Any:
    """The barrier as one scalar SQL expression (a bigint). Table names resolve on the
    connection's ``search_path``, as every statement of the store's does."""
    snap = select(func.pg_current_snapshot().label("s")).cte("snap", nesting=True).prefix_with("MATERIALIZED")
    ours = union_all(
        select(cast(_regclass("events"), OID).label("rel")),
        select(cast(_regclass("sessions"), OID).label("rel")),
        select(_pg_inherits.c.inhrelid).where(_pg_inherits.c.inhparent == _regclass("events")),
    ).cte("ours", nesting=True).prefix_with("MATERIALIZED")
    l = _pg_locks.alias("l")
    this_db = select(_pg_database.c.oid).where(_pg_database.c.datname == func.current_database())
    locks = (
        select(l.c.locktype, l.c.transactionid, l.c.virtualtransaction)
        .where(
            l.c.granted,
            or_(
                l.c.locktype == inline("transactionid", Text),
                and_(
                    l.c.locktype == inline("relation", Text),
                    l.c.database == this_db.scalar_subquery(),
                    l.c.relation.in_(select(ours.c.rel)),
                ),
            ),
        )
        .cte("locks", nesting=True)
        .prefix_with("MATERIALIZED")
    )
    x = func.pg_snapshot_xip(snap.c.s).column_valued("x")
    t, r = locks.alias("t"), locks.alias("r")
    # Passed over only when held by a transaction with no lock on our tables and still in
    # progress after pg_locks was read (the CASE orders the two: see the module's notes).
    writes_nothing = exists().where(
        t.c.locktype == inline("transactionid", Text),
        t.c.transactionid == func.xid(x),
        ~exists().where(
            r.c.locktype == inline("relation", Text),
            r.c.virtualtransaction == t.c.virtualtransaction,
        ),
    )
    kept = case(
        (writes_nothing, func.pg_xact_status(x).is_distinct_from(inline("in progress", Text))),
        else_=true(),
    )
    oldest = select(func.min(_bigint(x))).where(kept).scalar_subquery()
    barrier = select(func.least(_bigint(func.pg_snapshot_xmax(snap.c.s)), oldest)).select_from(snap)
    return barrier.add_cte(snap, ours, locks, nest_here=True).scalar_subquery()
