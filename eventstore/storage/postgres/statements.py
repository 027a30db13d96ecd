"""PostgreSQL's own statements: the one-round-trip appends and load, the feed's barrier and channel."""

from __future__ import annotations

from typing import Any

from sqlalchemy import exists, select

from eventstore.core.rows import DIGEST_SIZE
from eventstore.storage.catalogue import PG_CATALOGUE_SET
from eventstore.storage.postgres.feed_barrier import writers_barrier
from eventstore.storage.schema import events

__all__ = [
    "FEED_XACT",
    "feed_channel",
    "KEY_PARAM",
    "APPEND_FAST",
    "APPEND_FAST_NO_SNAPSHOT",
    "APPEND_ONE",
    "APPEND_BATCHES",
    "LOAD",
    "LOAD_BY_KEY",
    "BAND_SETTINGS",
    "MIGRATION_LOCK",
    "snapshot_xmin",
    "feed_barrier_stmt",
]

# pg_advisory_xact_lock key for migrations: crc32(b"eventstore-migrate").
MIGRATION_LOCK = 0x4E5F_7A31


#: The default of ``events.xact`` (revision 0003): the writing transaction's id. It is the
#: key of the feed's visibility barrier: a transaction's id is assigned before it commits,
#: so rows below the oldest transaction that can still write one are all committed and no
#: row can ever be added below it again.
FEED_XACT = "(pg_current_xact_id()::text)::bigint"


#: The channel followers listen on, for the events table the search path finds: it names
#: the table by its OID, so stores on different schemas of one server wake only their own.
_FEED_CHANNEL = "SELECT 'eventstore_' || to_regclass('events')::oid::text"


def feed_channel() -> str:
    """The statement that names the notification channel of this schema's events table."""
    return _FEED_CHANNEL


# The session key of a hot statement, for its scans of `events` and `snapshots`: on
# partitioned tables a key known when the execution starts lets the executor prune the
# other partitions then, where a key read from another row of the statement leaves the
# cached generic plan to set up a scan of every partition and choose at run time. It is
# the parameter plus a zero the planner cannot fold (now() is STABLE) on purpose: a bare
# parameter is pruned on at plan time in each custom plan, which then looks far cheaper
# than the generic one, and PostgreSQL re-plans the statement on every execution (slower
# than the run-time pruning it replaces); a stable expression is pruned on only at
# executor start-up, both plans cost the same, and the cached generic plan is used.
KEY_PARAM = "(%(pk)s::int + (now() IS NULL)::int)"

# One statement, one round trip, its own transaction (run in autocommit): move the head
# only if it is still what the writer saw (the version check built in; the UPDATE takes
# the session's row lock), insert the batch from arrays, and store the snapshots the batch
# reaches with the message blobs they add. Each event's feed number is the transaction's
# id, raised to the session's previous event's (see eventstore/core/feed_rules.py). Every insert
# selects FROM moved, so nothing at all is written when the head had moved on. Arrays and bytes are sent in binary (%b):
# psycopg's text quoting of a hundred bytea elements costs milliseconds.
APPEND_FAST = """
WITH moved AS (
    UPDATE sessions SET head = %(head)s, head_hash = %(hash)b, head_turn = %(turn)s,
        {CATALOGUE}
    WHERE pk = %(pk)s AND head = %(old_head)s AND head_hash = %(old_hash)b AND closed_at IS NULL
    RETURNING pk
), ins AS (
    INSERT INTO events
        (session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash,
         xact)
    SELECT moved.pk, u.version, u.event_id, u.type, u.turn, u.payload,
           %(recorded_at)s::bigint, %(actor)s::text, %(metadata)b::bytea, u.hash,
           greatest({FEED_XACT}, (SELECT p.xact FROM events p
                                   WHERE p.session_pk = {KEY} AND p.version = %(old_head)s))
    FROM moved, unnest(%(e_versions)b::int[], %(e_ids)b::text[], %(e_types)b::text[],
                       %(e_turns)b::int[], %(e_payloads)b::bytea[], %(e_hashes)b::bytea[])
         AS u(version, event_id, type, turn, payload, hash)
    RETURNING 1
), blobs AS (
    INSERT INTO snapshot_blobs (digest, body)
    SELECT b.digest, b.body
    FROM moved, unnest(%(digests)b::bytea[], %(bodies)b::bytea[]) AS b(digest, body)
    ON CONFLICT DO NOTHING
), snaps AS (
    INSERT INTO snapshots (session_pk, version, reducer_version, rest, message_digests)
    SELECT moved.pk, n.version, n.reducer_version, n.rest, n.message_digests
    FROM moved, unnest(%(s_versions)b::int[], %(s_reducers)b::int[], %(s_rests)b::bytea[],
                       %(s_digests)b::bytea[]) AS n(version, reducer_version, rest, message_digests)
    ON CONFLICT (session_pk, version) DO UPDATE SET
        reducer_version = excluded.reducer_version,
        rest = excluded.rest,
        message_digests = excluded.message_digests
)
SELECT count(*) FROM ins
""".replace("{FEED_XACT}", FEED_XACT).replace("{KEY}", KEY_PARAM).replace("{CATALOGUE}", PG_CATALOGUE_SET)

# The same without the snapshot parts, for the (most frequent) batches that reach none.
APPEND_FAST_NO_SNAPSHOT = (
    APPEND_FAST[: APPEND_FAST.index("), blobs AS (")]
    + """
)
SELECT count(*) FROM ins
"""
)

# A one-event batch without snapshots (most appends of a streamed reply): the same head
# check and insert with scalar parameters. Array parameters cost the client ~0.1 ms per
# statement to adapt (psycopg inspects every list), more than the insert itself.
APPEND_ONE = """
WITH moved AS (
    UPDATE sessions SET head = %(head)s::int, head_hash = %(hash)b, head_turn = %(turn)s::int,
        {CATALOGUE}
    WHERE pk = %(pk)s::int AND head = %(old_head)s::int AND head_hash = %(old_hash)b
          AND closed_at IS NULL
    RETURNING pk
)
INSERT INTO events
    (session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash, xact)
SELECT moved.pk, %(head)s::int, %(event_id)s::text, %(type)s::text, %(turn)s::int,
       %(payload)b, %(recorded_at)s::bigint, %(actor)s::text, %(metadata)b::bytea, %(hash)b,
       greatest({FEED_XACT}, (SELECT p.xact FROM events p
                               WHERE p.session_pk = {KEY} AND p.version = %(old_head)s::int))
FROM moved
""".replace("{FEED_XACT}", FEED_XACT).replace("{KEY}", KEY_PARAM).replace("{CATALOGUE}", PG_CATALOGUE_SET)

# A group commit of streaming turns in one statement, one round trip, its own transaction:
# move each session's head only if it is still what its turn saw, the turn still holds the
# lease and the session is open (renewing or giving up the lease), then insert the events
# and snapshots of the sessions that moved. Returns the pks that moved. A batch without a
# writer is a plain append (the async store's group commit): the lease is left alone.
APPEND_BATCHES = """
WITH b AS (
    SELECT * FROM unnest(%(pks)b::int[], %(old_heads)b::int[], %(old_hashes)b::bytea[],
                         %(writers)b::text[], %(heads)b::int[], %(hashes)b::bytea[],
                         %(turns)b::int[], %(releases)b::bool[], %(claims)b::bool[],
                         %(c_updated)b::bigint[], %(c_st_u)b::text[], %(c_st_n)b::text[],
                         %(c_reset)b::int[], %(c_text)b::text[])
        AS b(pk, old_head, old_hash, writer, head, hash, turn, release, claim,
             c_updated, c_st_u, c_st_n, c_reset, c_text)
), moved AS (
    UPDATE sessions s SET head = b.head, head_hash = b.hash, head_turn = b.turn,
        updated_at = coalesce(b.c_updated, s.updated_at),
        status = CASE WHEN s.first_text IS NOT NULL THEN coalesce(b.c_st_u, s.status)
                      ELSE coalesce(b.c_st_n, s.status) END,
        first_text = CASE WHEN b.c_reset = 1 THEN b.c_text ELSE coalesce(s.first_text, b.c_text) END,
        writer = CASE WHEN b.writer IS NULL THEN s.writer WHEN b.release THEN NULL ELSE b.writer END,
        writer_seen = CASE WHEN b.writer IS NULL THEN s.writer_seen
                           WHEN b.release THEN NULL ELSE %(seen)s::bigint END
    FROM b
    WHERE s.pk = b.pk AND s.head = b.old_head AND s.head_hash = b.old_hash
      AND (CASE WHEN b.writer IS NULL THEN true
                WHEN b.claim THEN s.writer IS NULL ELSE s.writer = b.writer END)
      AND s.closed_at IS NULL
    RETURNING s.pk
), ins AS (
    INSERT INTO events
        (session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash,
         xact, native)
    SELECT u.pk, u.version, u.event_id, u.type, u.turn, u.payload, u.recorded_at, u.actor,
           u.metadata, u.hash,
           greatest({FEED_XACT}, (SELECT p.xact FROM events p
                                   WHERE p.session_pk = u.pk AND p.version = b.old_head)),
           u.native
    FROM unnest(%(e_pks)b::int[], %(e_versions)b::int[], %(e_ids)b::text[], %(e_types)b::text[],
                %(e_turns)b::int[], %(e_payloads)b::bytea[], %(e_times)b::bigint[],
                %(e_actors)b::text[], %(e_metas)b::bytea[], %(e_hashes)b::bytea[],
                %(e_natives)b::bytea[])
         AS u(pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash,
              native)
    JOIN b ON b.pk = u.pk
    WHERE u.pk IN (SELECT pk FROM moved)
), blobs AS (
    INSERT INTO snapshot_blobs (digest, body)
    SELECT n.digest, n.body
    FROM unnest(%(b_pks)b::int[], %(b_digests)b::bytea[], %(b_bodies)b::bytea[])
         AS n(pk, digest, body)
    WHERE n.pk IN (SELECT pk FROM moved)
    ON CONFLICT DO NOTHING
), snaps AS (
    INSERT INTO snapshots (session_pk, version, reducer_version, rest, message_digests)
    SELECT n.pk, n.version, n.reducer_version, n.rest, n.message_digests
    FROM unnest(%(s_pks)b::int[], %(s_versions)b::int[], %(s_reducers)b::int[],
                %(s_rests)b::bytea[], %(s_digests)b::bytea[])
         AS n(pk, version, reducer_version, rest, message_digests)
    WHERE n.pk IN (SELECT pk FROM moved)
    ON CONFLICT (session_pk, version) DO UPDATE SET
        reducer_version = excluded.reducer_version,
        rest = excluded.rest,
        message_digests = excluded.message_digests
)
SELECT coalesce(array_agg(pk), '{}') FROM moved
""".replace("{FEED_XACT}", FEED_XACT)


def snapshot_xmin() -> Any:
    """The oldest transaction that can still write an event, in the statement's snapshot:
    every row below it is committed for good, and no row can be added below it any more.
    Not the cluster's oldest transaction: a stranger's must not hold the feed (see
    :mod:`eventstore.storage.postgres.feed_barrier`)."""
    return writers_barrier()


#: A band is always an index range, but the planner knows it only from statistics: on a
#: table not analysed yet it would read the whole table for every page.
BAND_SETTINGS = "SET LOCAL enable_seqscan = off"


def feed_barrier_stmt() -> Any:
    """The barrier, and whether committed rows wait at or above it — in one snapshot."""
    b = select(snapshot_xmin().label("x")).subquery("b")
    return select(b.c.x, exists().where(events.c.xact >= b.c.x))


# A root session's load in one round trip: the session row, its newest usable snapshot
# at or below the version (made by this reducer, or the compaction baseline whatever its
# reducer), the snapshot's stored blobs as an array in its order (the digests are split
# with generate_series; the codec compressed them, so the server sends them as stored, a
# fifth of the state's bytes), and the tail payloads joined in version order. Python then
# unpacks the blobs and parses two JSON arrays. Branches get only their row (the lineage is
# read the general way). LATERAL joins rather than CTEs: cheaper to plan,
# which is most of a cold load's server time. {KEY} is how the snapshot and event scans
# name the session's key (see LOAD_BY_KEY).
LOAD_TEMPLATE = f"""
SELECT s.pk, s.id, s.parent_pk, s.fork_version, s.head, s.head_hash, s.head_turn,
       s.baseline, s.baseline_hash, s.baseline_turn, s.created_at,
       n.version, n.rest, m.bodies, m.n_digests, m.n_found, t.payloads, t.n
FROM sessions s
LEFT JOIN LATERAL (
    -- `|| ''` detoasts the digests once, here, not once per message in the split below.
    SELECT x.version, x.rest, x.message_digests || ''::bytea AS md
    FROM snapshots x
    WHERE x.session_pk = {{KEY}} AND s.parent_pk IS NULL AND x.version > 0
      AND x.version <= COALESCE(%(version)s::int, s.head)
      AND (x.reducer_version = %(rv)s OR x.version = s.baseline)
    ORDER BY x.version DESC
    LIMIT 1
) n ON true
LEFT JOIN LATERAL (
    -- One index probe per digest, as a scalar subquery: a join here may be planned as a
    -- hash join over every blob of every session.
    SELECT array_agg(c.body ORDER BY c.i) AS bodies,
           count(*) AS n_digests, count(c.body) AS n_found
    FROM (
        SELECT g.i, (
            SELECT b.body FROM snapshot_blobs b
            WHERE b.digest = substring(n.md FROM g.i * {DIGEST_SIZE} + 1 FOR {DIGEST_SIZE})
        ) AS body
        FROM generate_series(0, length(n.md) / {DIGEST_SIZE} - 1) AS g(i)
        OFFSET 0  -- keeps the subquery from being inlined twice, into both aggregates
    ) c
) m ON true
LEFT JOIN LATERAL (
    SELECT string_agg(e.payload, ','::bytea ORDER BY e.version) AS payloads, count(*) AS n
    FROM events e
    WHERE s.parent_pk IS NULL AND e.session_pk = {{KEY}}
      AND e.version > COALESCE(n.version, 0)
      AND e.version <= COALESCE(%(version)s::int, s.head)
) t ON true
WHERE s.id = %(id)s
"""
LOAD = LOAD_TEMPLATE.replace("{KEY}", "s.pk")
# The same with the session's key given as well, when the storage knows it (see
# KEY_PARAM): the partitions of other sessions are pruned when the execution starts.
LOAD_BY_KEY = LOAD_TEMPLATE.replace("{KEY}", KEY_PARAM) + "  AND s.pk = %(pk)s::int\n"

