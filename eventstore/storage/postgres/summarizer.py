"""The feed's BRIN index summarizer: keeps a band's reads to the newest ranges while commits come."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import psycopg.errors

from eventstore.storage.schema import BRIN_PAGES_PER_RANGE

_log = logging.getLogger(__name__)

__all__ = ["SUMMARIZE_EVERY", "SUMMARIZE_RANGES", "FeedIndexSummarizer"]

#: The feed's BRIN index is summarized by the writers' notifier at most this often (s).
SUMMARIZE_EVERY = 1.0
#: Ranges summarized by one statement at most (a restarted store starts from the first).
SUMMARIZE_RANGES = 4096

# Summarizes the complete ranges of every BRIN index on the events table (or on its
# partitions) from where this store got to, leaving the newest range (and one more:
# concurrent writers fill their own pages) to inserts. Its lock conflicts with VACUUM's
# and with itself: one store at a time summarizes (the others skip at once, returning no
# rows), and rather than wait for a VACUUM it gives up and tries again later. {done}:
# (index, start) rows; it returns each index's next start.
_SUMMARIZE = f"""
SET LOCAL lock_timeout = '50ms';
WITH done(idx, start) AS (VALUES (0::oid, 0::bigint){{done}}),
mine AS (
    SELECT pg_try_advisory_xact_lock(
        hashtextextended('eventstore summarize ' || 'events'::regclass::oid::text, 0)) AS ok
),
ix AS (
    SELECT i.indexrelid AS idx,
           pg_relation_size(i.indrelid) / current_setting('block_size')::bigint AS pages
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_am a ON a.oid = c.relam
    WHERE (SELECT ok FROM mine) AND a.amname = 'brin' AND (
        i.indrelid = 'events'::regclass
        OR i.indrelid IN (SELECT relid FROM pg_partition_tree('events') WHERE isleaf))
),
todo AS (
    SELECT ix.idx,
           CASE WHEN coalesce(d.start, 0) > ix.pages THEN 0 ELSE coalesce(d.start, 0) END AS start,
           ix.pages - 2 * {BRIN_PAGES_PER_RANGE} AS last
    FROM ix LEFT JOIN done d ON d.idx = ix.idx
),
span AS (
    SELECT idx, start, least(last, start + {BRIN_PAGES_PER_RANGE * (SUMMARIZE_RANGES - 1)}) AS stop
    FROM todo
)
SELECT idx::bigint,
       CASE WHEN stop < start THEN start
            ELSE start + ((stop - start) / {BRIN_PAGES_PER_RANGE} + 1) * {BRIN_PAGES_PER_RANGE} END,
       (SELECT count(*) FROM generate_series(start, stop, {BRIN_PAGES_PER_RANGE}) b
        WHERE brin_summarize_range(idx::regclass, b) > 0)
FROM span
"""


class FeedIndexSummarizer:
    """Summarizes the complete ranges of the events table's BRIN indexes, from where this
    store got to (run by the writers' notifier on its own connection)."""

    def __init__(self) -> None:
        # BRIN index -> the first table page not summarized yet by this store
        self._summarized: dict[int, int] = {}
        self._summarize_at = 0.0  # monotonic
        self._cannot_summarize = False
        #: ranges this store summarized (for tests and benchmarks)
        self.summarized = 0

    def summarize(self, conn: Any, *, final: bool) -> None:
        """Summarize the feed index's newly complete ranges: at most once a second while
        commits come, and once when they stop.

        A band reads every range not summarized yet (a BRIN index cannot tell what such a
        range holds), and autovacuum summarizes them only on its own schedule (a minute
        apart by default): a busy table would make every follower read the last minute of
        writes again on each wake-up.
        """
        now = time.monotonic()
        if self._cannot_summarize or (now < self._summarize_at and not final):
            return
        self._summarize_at = now + SUMMARIZE_EVERY
        done = "".join(f", ({int(i)}::oid, {int(b)}::bigint)" for i, b in self._summarized.items())
        try:
            cur = conn.execute(_SUMMARIZE.format(done=done))
            while cur.description is None and cur.nextset():
                pass
            rows = cur.fetchall()
        except psycopg.errors.LockNotAvailable:
            return  # VACUUM holds the table: next time
        except psycopg.OperationalError:
            raise  # the connection: the notifier reconnects
        except psycopg.Error:
            # Not the table's owner (or no BRIN support): autovacuum's summaries will do.
            self._cannot_summarize = True
            return
        if rows:  # none: another store is summarizing
            self._summarized = {int(i): int(start) for i, start, _ in rows}
            self.summarized += sum(int(n) for _, _, n in rows)
        else:
            # Said on the log, so an operator (and a test) can see a skip happen.
            _log.debug("feed index not summarized: another store is summarizing it")

