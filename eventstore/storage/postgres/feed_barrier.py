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

from sqlalchemy import BigInteger, literal_column

__all__ = ["WRITERS_BARRIER_SQL", "writers_barrier"]

#: The barrier as one scalar SQL expression (a bigint). Table names resolve on the
#: connection's ``search_path``, as every statement of the store's does.
WRITERS_BARRIER_SQL = """(
WITH snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s),
ours AS MATERIALIZED (
    SELECT 'events'::regclass::oid AS rel
    UNION ALL SELECT 'sessions'::regclass::oid
    UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = 'events'::regclass),
locks AS MATERIALIZED (
    SELECT l.locktype, l.transactionid, l.virtualtransaction
    FROM pg_locks l
    WHERE l.granted AND (
        l.locktype = 'transactionid'
        OR (l.locktype = 'relation'
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND l.relation IN (SELECT rel FROM ours))))
SELECT least(
    pg_snapshot_xmax(snap.s)::text::bigint,
    (SELECT min(x::text::bigint) FROM pg_snapshot_xip(snap.s) AS x
     WHERE CASE
        WHEN EXISTS (
            SELECT 1 FROM locks t
            WHERE t.locktype = 'transactionid' AND t.transactionid = xid(x)
              AND NOT EXISTS (
                  SELECT 1 FROM locks r
                  WHERE r.locktype = 'relation' AND r.virtualtransaction = t.virtualtransaction))
        THEN pg_xact_status(x) IS DISTINCT FROM 'in progress'
        ELSE true
     END))
FROM snap
)"""


def writers_barrier() -> Any:
    """:data:`WRITERS_BARRIER_SQL` as a SQLAlchemy column expression."""
    return literal_column(WRITERS_BARRIER_SQL, BigInteger)
