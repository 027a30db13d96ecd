"""The feed's BRIN index summarizer: keeps a band's reads to the newest ranges while commits come."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import psycopg.errors
from psycopg.rows import namedtuple_row
from sqlalchemy import ARRAY, BigInteger, Text, bindparam, case, cast, column, func, or_, select, table
from sqlalchemy.dialects.postgresql import OID, REGCLASS
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect

from eventstore.storage.postgres.statements import set_config
from eventstore.storage.schema import BRIN_PAGES_PER_RANGE
from eventstore.storage.sql.statements import Compiled, inline, inline_int

_log = logging.getLogger(__name__)

__all__ = ["SUMMARIZE_EVERY", "SUMMARIZE_RANGES", "FeedIndexSummarizer", "summarize_stmt"]

#: The feed's BRIN index is summarized by the writers' notifier at most this often (s).
SUMMARIZE_EVERY = 1.0
#: Ranges summarized by one statement at most (a restarted store starts from the first).
SUMMARIZE_RANGES = 4096

_R = BRIN_PAGES_PER_RANGE
_pg_index = table("pg_index", column("indexrelid", OID), column("indrelid", OID))
_pg_class = table("pg_class", column("oid", OID), column("relam", OID))
_pg_am = table("pg_am", column("oid", OID), column("amname", Text))


def summarize_stmt() -> Any:
    """Summarize the complete ranges of every BRIN index on the events table (or on its
    partitions) from where this store got to (``idx`` and ``start``: arrays of indexes and
    their next start), leaving the newest range (and one more: concurrent writers fill
    their own pages) to inserts; one row an index: its next start and how many ranges
    were summarized.

    One store at a time summarizes (an advisory lock: the others skip at once, returning
    no rows). Its constants are written into the statement, which is compiled once."""
    events_oid = cast(cast(inline("events", Text), REGCLASS), OID)
    d = (
        func.unnest(bindparam("idx", type_=ARRAY(BigInteger)), bindparam("start", type_=ARRAY(BigInteger)))
        .table_valued(column("idx", BigInteger), column("start", BigInteger))
        .render_derived(name="done")
    )
    key = func.hashtextextended(inline("eventstore summarize ", Text) + cast(events_oid, Text), inline_int(0))
    mine = select(func.pg_try_advisory_xact_lock(key).label("ok")).cte("mine")
    leaves = func.pg_partition_tree(inline("events", Text)).table_valued("relid", "isleaf")
    i, c, a = _pg_index.alias("i"), _pg_class.alias("c"), _pg_am.alias("a")
    ix = (
        select(
            i.c.indexrelid.label("idx"),
            (
                func.pg_relation_size(i.c.indrelid, type_=BigInteger)
                // cast(func.current_setting(inline("block_size", Text)), BigInteger)
            ).label("pages"),
        )
        .select_from(i.join(c, c.c.oid == i.c.indexrelid).join(a, a.c.oid == c.c.relam))
        .where(
            select(mine.c.ok).scalar_subquery(),
            a.c.amname == inline("brin", Text),
            or_(
                i.c.indrelid == events_oid,
                i.c.indrelid.in_(select(leaves.c.relid).where(leaves.c.isleaf)),
            ),
        )
        .cte("ix")
    )
    start = func.coalesce(d.c.start, inline_int(0))
    todo = (
        select(
            ix.c.idx,
            case((start > ix.c.pages, inline_int(0)), else_=start).label("start"),
            (ix.c.pages - inline_int(2 * _R)).label("last"),
        )
        .select_from(ix.outerjoin(d, cast(d.c.idx, OID) == ix.c.idx))
        .cte("todo")
    )
    span = select(
        todo.c.idx,
        todo.c.start,
        func.least(todo.c.last, todo.c.start + inline_int(_R * (SUMMARIZE_RANGES - 1)), type_=BigInteger).label("stop"),
    ).cte("span")
    b = func.generate_series(span.c.start, span.c.stop, inline_int(_R)).column_valued("b")
    summarized = (
        select(func.count())
        .where(func.brin_summarize_range(cast(span.c.idx, REGCLASS), b) > inline_int(0))
        .scalar_subquery()
    )
    ranges = (span.c.stop - span.c.start) // inline_int(_R) + inline_int(1)
    return select(
        cast(span.c.idx, BigInteger).label("idx"),
        case((span.c.stop < span.c.start, span.c.start), else_=span.c.start + ranges * inline_int(_R)).label("next"),
        summarized.label("summarized"),
    )


_SUMMARIZE = Compiled(summarize_stmt(), psycopg_dialect())
#: Its lock conflicts with VACUUM's and with itself: rather than wait for a VACUUM it gives
#: up and tries again later (the setting holds until the summary's transaction ends).
_LOCK_TIMEOUT = set_config("lock_timeout", "50ms", local=True)


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
        done = {"idx": list(self._summarized), "start": list(self._summarized.values())}
        try:
            with conn.transaction():
                conn.execute(_LOCK_TIMEOUT)
                cur = conn.cursor(row_factory=namedtuple_row)
                cur.execute(_SUMMARIZE.sql, _SUMMARIZE.args(done))
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
            self._summarized = {int(r.idx): int(r.next) for r in rows}
            self.summarized += sum(int(r.summarized) for r in rows)
        else:
            # Said on the log, so an operator (and a test) can see a skip happen.
            _log.debug("feed index not summarized: another store is summarizing it")

