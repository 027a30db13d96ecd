"""Feed benchmark: how soon a follower sees a commit, how fast the feed reads, what it costs.

Run (PostgreSQL from ``EVENTSTORE_TEST_PG_URL``, as ``scripts/with-postgres`` exports it)::

    scripts/with-postgres .venv/bin/python -m benchmarks feed            # ~2 min
    scripts/with-postgres .venv/bin/python -m benchmarks feed --quick    # ~40 s
    ... --no-record      # do not rewrite the "## Feed" section of benchmarks/RESULTS.md

Three measurements, on PostgreSQL and SQLite, in one run:

1. **Commit-to-follower latency.** 1, 16 and 64 writer threads, each appending one event
   per transaction to its own session (paced: one append, then 20 ms of sleep), while one
   ``store.feed()`` follower runs through the writers' store, or in another process through
   a store of its own; on PostgreSQL also through the writers' store while a stranger holds
   an idle transaction (one that took an id) open in another database. Latency = when the
   follower got the event − when the writer's ``append`` returned (so the append's own
   return trip is not counted against the feed). p50 / p99 / max over every event, and the
   writers' ``append`` times beside them.
2. **Feed read throughput.** ``list(store.feed(idle_timeout=0))`` over a filled database,
   against the baseline a consumer would write by hand: keyset paging with
   ``SELECT … ORDER BY session_pk, version LIMIT 500`` on the same table (session ids
   joined, each row made into the same ``RecordedEvent``), in the same run, alternating.
   Best of 10 each. On PostgreSQL in three states of the table (``PG_STATES``): just
   written, after ``ANALYZE`` (the BRIN index's newest ranges not yet summarized) and
   after ``VACUUM``; with ``EXPLAIN ANALYZE`` of one page's band in each.
3. **What the feed adds to an append.** The store's single-event append statements with
   all of the feed's parts (the ``xact`` value, its index; on SQLite the deletion clock
   and the number guard triggers too: PostgreSQL has no feed trigger since revision 0006,
   its wake-up is sent by the store after the commit, so it is in ``EventStore.append``'s
   time), with its storage only (value and index, no trigger) and without any, raw, one event per transaction, on three
   databases in alternating blocks; the differences are also shown against a whole
   ``EventStore.append`` measured in the same run. Bytes/event: what the events table and
   its indexes grew by per event over the same appends (after a warm-up), with and
   without the feed's column and index; what they cost once is shown apart.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import psycopg
from sqlalchemy import create_engine, text

from benchmarks._common import machine, record_section
from eventstore import EventStore, RecordedEvent

__all__ = ["main"]

SECTION = "## Feed"
OUT = Path(__file__).parent / "out" / "feed.json"
RESULTS = Path(__file__).parent / "RESULTS.md"
PACE = 0.02
#: Reads of the whole feed (and of the raw paging), alternating; the best of each counts.
ROUNDS = 10


# -- 1. latency -------------------------------------------------------------------------------


def _follow_elsewhere(url: str, after: str | None, end: str, out: Any) -> None:
    """A feed follower in a process of its own: when each event arrived, until ``end``'s."""
    got: dict[tuple[str, int], float] = {}
    with EventStore(url) as st, st.feed(after=after, idle_timeout=30.0) as follower:
        out.put("ready")
        for ev in follower:
            got[(ev.session_id, ev.version)] = time.monotonic()
            if ev.session_id == end:
                break
    out.put(got)


def latency(store: EventStore, url: str, writers: int, seconds: float, elsewhere: bool) -> dict[str, Any]:
    """p50/p99/max seconds from a writer's acknowledged commit to the feed follower.

    The follower reads through the writers' ``store``, or with ``elsewhere`` through a store
    of its own in another process (woken by the writers' store's notification). Both
    processes read ``time.monotonic()``: one clock for the whole machine on Linux.
    """
    start = list(store.feed(idle_timeout=0))
    after = start[-1].position if start else None
    acked: dict[tuple[str, int], float] = {}
    took: list[float] = []
    got: dict[tuple[str, int], float] = {}
    stop = threading.Event()
    run = uuid.uuid4().hex[:6]
    end = f"lat-{run}-end"

    def write(w: int) -> None:
        session = f"lat-{run}-{w}"
        while not stop.is_set():
            t0 = time.monotonic()
            r = store.append(session, [{"type": "stop"}])
            acked[(session, r.version)] = t1 = time.monotonic()
            took.append(t1 - t0)
            stop.wait(PACE)

    if elsewhere:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        reader: Any = ctx.Process(target=_follow_elsewhere, args=(url, after, end, queue))
        reader.start()
        if queue.get(timeout=120) != "ready":
            raise RuntimeError("the follower process did not start")
    else:

        def follow() -> None:
            with store.feed(after=after, idle_timeout=30.0) as follower:
                for ev in follower:
                    got[(ev.session_id, ev.version)] = time.monotonic()
                    if ev.session_id == end:
                        break

        reader = threading.Thread(target=follow)
        reader.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    store.append(end, [{"type": "stop"}])  # the follower's last event: everything came before it
    if elsewhere:
        got = queue.get(timeout=60)
    reader.join(60)
    lat = sorted(max(0.0, got[k] - acked[k]) for k in acked if k in got)
    missing = len([k for k in acked if k not in got])
    took.sort()
    return {
        "writers": writers,
        "elsewhere": elsewhere,
        "events": len(acked),
        "events_per_s": len(acked) / seconds,
        "missing": missing,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "max_ms": 1000 * lat[-1],
        "append_p50_ms": 1000 * took[len(took) // 2],
        "append_p99_ms": 1000 * took[min(len(took) - 1, int(len(took) * 0.99))],
    }


# -- 2. read throughput -------------------------------------------------------------------------


def fill(store: EventStore, sessions: int, per_session: int) -> int:
    for s in range(sessions):
        store.append(f"fill-{s}", [{"type": "send", "id": f"u-{i}", "text": f"message {i} " * 4} for i in range(per_session)])
    return sessions * per_session


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _record(r: Any) -> RecordedEvent:
    """What the hand-written consumer makes of a row: the same public record the feed yields."""
    return RecordedEvent(
        session_id=r[2],
        version=r[1],
        event_id=r[8],
        type=r[3],
        action=orjson.loads(r[5]),
        turn=r[4],
        recorded_at=_EPOCH + dt.timedelta(microseconds=r[6]),
        actor=r[7],
        metadata=None if r[9] is None else orjson.loads(r[9]),
        hash=bytes(r[10]).hex(),
    )


def _raw_paging(url: str, dialect: str) -> Callable[[], int]:
    """A hand-written consumer: keyset pages ordered by the primary key."""
    sql = (
        "SELECT e.session_pk, e.version, s.id, e.type, e.turn, e.payload, e.recorded_at, e.actor, "
        "e.event_id, e.metadata, e.hash "
        "FROM events e JOIN sessions s ON s.pk = e.session_pk "
        "WHERE (e.session_pk > {p} OR (e.session_pk = {p} AND e.version > {p})) "
        "ORDER BY e.session_pk, e.version LIMIT 500"
    )
    if dialect == "postgresql":
        dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
        query = sql.format(p="%s")

        def run_pg() -> int:
            n, last = 0, (0, 0)
            with psycopg.connect(dsn) as conn:
                while True:
                    rows = conn.execute(query, (last[0], last[0], last[1])).fetchall()
                    for r in rows:
                        _record(r)
                    n += len(rows)
                    if len(rows) < 500:
                        return n
                    last = (rows[-1][0], rows[-1][1])

        return run_pg
    import sqlite3

    path = url.removeprefix("sqlite:///")
    query = sql.format(p="?")

    def run_sqlite() -> int:
        n, last = 0, (0, 0)
        conn = sqlite3.connect(path)
        try:
            while True:
                rows = conn.execute(query, (last[0], last[0], last[1])).fetchall()
                for r in rows:
                    _record(r)
                n += len(rows)
                if len(rows) < 500:
                    return n
                last = (rows[-1][0], rows[-1][1])
        finally:
            conn.close()

    return run_sqlite


def throughput(store: EventStore, url: str, dialect: str, n: int) -> dict[str, Any]:
    def feed() -> int:
        return sum(1 for _ in store.feed(idle_timeout=0))

    raw = _raw_paging(url, dialect)
    out: dict[str, Any] = {"events": n}
    best = {"feed": float("inf"), "raw": float("inf")}
    for i in range(ROUNDS):  # alternating, so both see the same share of a busy machine
        for name, fn in ((("feed", feed), ("raw", raw)) if i % 2 == 0 else (("raw", raw), ("feed", feed))):
            t0 = time.perf_counter()
            got = fn()
            best[name] = min(best[name], time.perf_counter() - t0)
            assert got == n, (name, got, n)
    for name, seconds in best.items():
        out[f"{name}_events_per_s"] = n / seconds
    out["ratio"] = out["feed_events_per_s"] / out["raw_events_per_s"]
    return out


def band_plan(url: str) -> dict[str, Any]:
    """EXPLAIN ANALYZE of one feed page's band (about 1,000 events from the middle of the
    feed): the plan's scan nodes and how many heap pages it read, of the table's."""
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
        middle = conn.execute("SELECT count(*) FROM events").fetchone()[0] // 2  # type: ignore[index]
        lo, hi = (
            conn.execute("SELECT xact FROM events ORDER BY xact OFFSET %s LIMIT 1", (k,)).fetchone()[0]  # type: ignore[index]
            for k in (middle - 500, middle + 500)
        )
        conn.execute("SET LOCAL enable_seqscan = off")  # as the store's band read does
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM events WHERE xact >= %s AND xact <= %s "
            "ORDER BY xact, session_pk, version LIMIT 1000",
            (lo, hi),
        ).fetchone()[0][0]["Plan"]  # type: ignore[index]
        pages = conn.execute("SELECT pg_relation_size('events') / current_setting('block_size')::int").fetchone()[0]  # type: ignore[index]
    nodes, heap, todo = [], 0, [plan]
    while todo:
        node = todo.pop()
        nodes.append(node["Node Type"] + (f" on {node['Index Name']}" if "Index Name" in node else ""))
        heap += node.get("Exact Heap Blocks", 0) + node.get("Lossy Heap Blocks", 0)
        if node["Node Type"] == "Seq Scan":
            heap += pages  # every page of the table
        todo.extend(node.get("Plans", []))
    return {"nodes": nodes, "heap_pages": heap, "table_pages": pages, "ms": plan["Actual Total Time"]}


#: The states of a PostgreSQL table the feed is read in: as written (no statistics; the
#: BRIN ranges the writing store's notifier summarized as it went, at most a second and
#: two ranges behind), after ANALYZE (statistics too), after VACUUM (every range
#: summarized, as autovacuum leaves it).
PG_STATES = (("fresh", "just written", None), ("analyzed", "after ANALYZE", "ANALYZE events"), ("vacuumed", "after VACUUM", "VACUUM events"))


def maintain(url: str, statement: str) -> None:
    """Run ANALYZE or VACUUM on the events table (what autovacuum does in its own time)."""
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute(statement)


# -- 3. append cost and bytes -------------------------------------------------------------------

_PG_HEAD = (
    "WITH moved AS (UPDATE sessions SET head = %(v)s WHERE pk = %(pk)s AND head = %(old)s RETURNING pk) "
    "INSERT INTO events (session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash{x}) "
    "SELECT moved.pk, %(v)s, NULL, 'stop', 0, %(payload)s, %(t)s, NULL, NULL, %(hash)s{xv} FROM moved"
)
_PG_XACT = (
    ", greatest((pg_current_xact_id()::text)::bigint, "
    "(SELECT p.xact FROM events p WHERE p.session_pk = moved.pk AND p.version = %(old)s))"
)
_SQLITE_INSERT = (
    "INSERT INTO events (session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash{x}) "
    "VALUES (?, ?, NULL, 'stop', 0, ?, ?, NULL, NULL, ?{xv})"
)
_SQLITE_XACT = (
    ", max(coalesce((SELECT max(xact) FROM events), 0), "
    "coalesce((SELECT xact FROM feed_clock WHERE id = 1), 0)) + 1"
)
_PAYLOAD = b'{"type":"stop"}'


#: The triggers of the feed: SQLite's deletion clock and its guard of recorded feed numbers
#: (PostgreSQL's wake-up is no trigger: the store sends it after the commit).
_FEED_TRIGGERS: dict[str, tuple[str, ...]] = {
    "postgresql": (),
    "sqlite": ("DROP TRIGGER IF EXISTS events_feed_clock", "DROP TRIGGER IF EXISTS events_no_replace_xact"),
}


class _Appender:
    """One event per transaction on one database, with the feed's parts: ``"all"``,
    ``"storage"`` (its number and index, not its triggers) or ``"none"``."""

    def __init__(self, url: str, dialect: str, parts: str) -> None:
        feed = parts != "none"
        self.dialect, self.feed, self.version = dialect, feed, 0
        engine = create_engine(url)
        with engine.begin() as conn:
            if parts != "all":
                for stmt in _FEED_TRIGGERS[dialect]:
                    conn.execute(text(stmt))
            if not feed:  # the schema without the feed: no index (the column stays NULL)
                conn.execute(text("DROP INDEX IF EXISTS ix_events_xact"))
                if dialect == "postgresql":
                    conn.execute(text("ALTER TABLE events ALTER COLUMN xact DROP DEFAULT"))
            conn.execute(
                text("INSERT INTO sessions (id, head, head_hash, head_turn, created_at) VALUES ('ab', 0, :h, 0, 0)"),
                {"h": b"\0" * 32},
            )
            self.pk = conn.execute(text("SELECT pk FROM sessions WHERE id = 'ab'")).scalar()
        engine.dispose()
        if dialect == "postgresql":
            self.conn: Any = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=True)
            self.sql = _PG_HEAD.format(x=", xact" if feed else "", xv=_PG_XACT if feed else "")
        else:
            import sqlite3

            self.conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.sql = _SQLITE_INSERT.format(x=", xact" if feed else "", xv=_SQLITE_XACT if feed else "")

    def block(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            v = self.version + 1
            if self.dialect == "postgresql":
                self.conn.execute(
                    self.sql,
                    {"v": v, "pk": self.pk, "old": v - 1, "payload": _PAYLOAD, "t": v, "hash": b"\1" * 32},
                    prepare=True,
                )
            else:
                c = self.conn
                c.execute("BEGIN IMMEDIATE")
                c.execute("UPDATE sessions SET head = ? WHERE pk = ? AND head = ?", (v, self.pk, v - 1))
                c.execute(self.sql, (self.pk, v, _PAYLOAD, v, b"\1" * 32))
                c.execute("COMMIT")
            self.version = v
        return (time.perf_counter() - t0) / n

    def size(self) -> int:
        """Bytes of the events table with its indexes (every fork: BRIN has a free space map)."""
        if self.dialect == "postgresql":
            return int(self.conn.execute("SELECT pg_total_relation_size('events')").fetchone()[0])
        return int(
            self.conn.execute(
                "SELECT sum(pgsize) FROM dbstat WHERE name IN "
                "(SELECT name FROM sqlite_master WHERE tbl_name = 'events')"
            ).fetchone()[0]
        )

    def mark(self) -> None:
        """Start counting bytes here: what the table and its indexes cost once, whatever
        their size (BRIN's meta page, range map and free space map: 48 KiB), stays out."""
        self.marked = (self.size(), self.version)

    def bytes_per_event(self) -> float:
        """Bytes the table and its indexes grew by per event since :meth:`mark`."""
        size, version = self.marked
        return (self.size() - size) / (self.version - version)

    def close(self) -> None:
        self.conn.close()


def append_cost(urls: Sequence[str], dialect: str, blocks: int, per_block: int) -> dict[str, Any]:
    """The append statement with all of the feed, with its storage only, and without it,
    on three databases in alternating blocks; bytes per event with and without."""
    apps = {parts: _Appender(url, dialect, parts) for parts, url in zip(("all", "storage", "none"), urls)}
    try:
        for a in apps.values():
            a.block(200)  # warm-up
            a.mark()
        times: dict[str, list[float]] = {parts: [] for parts in apps}
        for i in range(blocks):
            for parts in list(apps) if i % 2 == 0 else reversed(list(apps)):
                times[parts].append(apps[parts].block(per_block))
        out = {f"{parts}_us": 1e6 * statistics.median(t) for parts, t in times.items()}
        for parts in ("all", "storage"):
            out[f"{parts}_ratio"] = statistics.median(x / y for x, y in zip(times[parts], times["none"]))
        out.update(
            bytes_with=apps["all"].bytes_per_event(),
            bytes_without=apps["none"].bytes_per_event(),
            fixed_with=apps["all"].marked[0],
            fixed_without=apps["none"].marked[0],
        )
        return out
    finally:
        for a in apps.values():
            a.close()


def store_append_us(store: EventStore, n: int) -> float:
    store.append("whole", [{"type": "stop"}])
    t0 = time.perf_counter()
    for _ in range(n):
        store.append("whole", [{"type": "stop"}])
    return 1e6 * (time.perf_counter() - t0) / n


# -- the run ------------------------------------------------------------------------------------


def _databases(dialect: str, tmp: Path) -> tuple[Callable[[], str], Callable[[], None]]:
    """A factory of fresh, migrated database URLs of one backend, and its cleanup."""
    made: list[str] = []
    if dialect == "sqlite":

        def new_sqlite() -> str:
            url = f"sqlite:///{tmp / f'{uuid.uuid4().hex[:8]}.db'}"
            EventStore(url).migrate()
            return url

        return new_sqlite, lambda: None
    admin = os.environ["EVENTSTORE_TEST_PG_URL"]
    dsn = admin.replace("postgresql+psycopg://", "postgresql://", 1)

    def new_pg() -> str:
        schema = f"bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        made.append(schema)
        url = f"{admin}{'&' if '?' in admin else '?'}options=-csearch_path%3D{schema}"
        with EventStore(url) as s:
            s.migrate()
        return url

    def drop() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for schema in made:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')

    return new_pg, drop


def run_backend(dialect: str, quick: bool, tmp: Path) -> dict[str, Any]:
    new, drop = _databases(dialect, tmp)
    seconds = 2.0 if quick else 4.0
    try:
        out: dict[str, Any] = {"latency": []}
        for writers in (1, 16, 64):
            url = new()
            with EventStore(url) as store:
                for elsewhere in (False, True):
                    out["latency"].append(latency(store, url, writers, seconds, elsewhere))
                    print(dialect, out["latency"][-1], flush=True)
        if dialect == "postgresql":
            # A stranger anywhere on the cluster must not hold the feed back: an idle
            # transaction that took an id, in another database, under a role with no privilege.
            from benchmarks.feed_barrier import _stranger  # that module imports this one

            for writers in (1, 16, 64):
                url = new()
                with EventStore(url) as store, _stranger(os.environ["EVENTSTORE_TEST_PG_URL"], "other-db", url):
                    out["latency"].append({**latency(store, url, writers, seconds, False), "idle_elsewhere": True})
                print(dialect, out["latency"][-1], flush=True)
        url = new()
        # Unsealed: the hand-written baseline pages the events table, which a background seal
        # would empty of every closed turn before the two are read side by side.
        with EventStore(url, seal=False) as store:
            n = fill(store, 100 if quick else 200, 100)
            if dialect == "postgresql":
                for state, _, statement in PG_STATES:
                    if statement is not None:
                        maintain(url, statement)
                    out[f"throughput_{state}"] = throughput(store, url, dialect, n)
                    out[f"plan_{state}"] = band_plan(url)
                    print(dialect, state, out[f"throughput_{state}"], out[f"plan_{state}"], flush=True)
            else:
                out["throughput"] = throughput(store, url, dialect, n)
                print(dialect, out["throughput"], flush=True)
            out["store_append_us"] = store_append_us(store, 300 if quick else 1000)
        out["append"] = append_cost([new(), new(), new()], dialect, 6 if quick else 12, 300)
        for parts in ("all", "storage"):
            out["append"][f"{parts}_delta_vs_store_append"] = (
                out["append"][f"{parts}_us"] - out["append"]["none_us"]
            ) / out["store_append_us"]
        print(dialect, out["append"], flush=True)
        return out
    finally:
        drop()


def _follower_label(r: dict[str, Any]) -> str:
    if r.get("idle_elsewhere"):
        return "the writers’ store, idle transaction elsewhere"
    return "another process" if r["elsewhere"] else "the writers’ store"


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        SECTION,
        "",
        f"`python -m benchmarks feed{' --quick' if results['quick'] else ''}` on {results['date']}, "
        f"{m['nproc']} CPUs, Python {m['python']}, {m['uname']}; PostgreSQL and SQLite on the same machine "
        "(followers, writers and the server share its cores).",
        "",
        "**Commit to follower** (one `store.feed()` follower; writers each append one event per "
        f"transaction to their own session, then sleep {int(PACE * 1000)} ms; latency from the writer's "
        "acknowledged commit to the follower's receipt). The follower reads through the writers' store, "
        "in their process (woken by the store itself at the commit), or through a store of its own in "
        "another process (woken by the writers' store's notification). The writers' own `append` "
        "times, from call to return, are shown for comparison: the feed hands an event out once "
        "every older transaction that can write an event has ended. \"idle transaction elsewhere\": "
        "the writers' store's follower while a role with no privilege holds `BEGIN; SELECT "
        "pg_current_xact_id()` open in another database of the cluster for the whole run. "
        "Target on PostgreSQL: p50 ≤ 20 ms, p99 ≤ 100 ms.",
        "",
        "| backend | writers | follower | events/s written | p50 | p99 | max | events missed "
        "| `append` p50 | `append` p99 |",
        "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for b in ("postgresql", "sqlite"):
        for r in results[b]["latency"]:
            lines.append(
                f"| {b} | {r['writers']} | {_follower_label(r)} | "
                f"{r['events_per_s']:.0f} | {r['p50_ms']:.1f} ms | "
                f"{r['p99_ms']:.1f} ms | {r['max_ms']:.1f} ms | {r['missing']} | "
                f"{r['append_p50_ms']:.1f} ms | {r['append_p99_ms']:.1f} ms |"
            )
    lines += [
        "",
        "**Feed read throughput** (the whole feed from the start, against hand-written keyset paging "
        "`SELECT … ORDER BY session_pk, version LIMIT 500`, each row made into the same `RecordedEvent`, "
        "on a store that does not seal, so both read the same rows; "
        f"best of {ROUNDS} each, alternating). "
        "Target ≥ 0.8×.",
        "",
        "| backend | events | feed | raw paging | feed ÷ raw |",
        "|---|--:|--:|--:|--:|",
    ]
    rows = [("postgresql", f"throughput_{state}", f"postgresql, {label}") for state, label, _ in PG_STATES]
    for b, key, label in (*rows, ("sqlite", "throughput", "sqlite")):
        t = results[b][key]
        lines.append(
            f"| {label} | {t['events']:,} | {t['feed_events_per_s']:,.0f} ev/s | "
            f"{t['raw_events_per_s']:,.0f} ev/s | {t['ratio']:.2f}× |"
        )
    lines += [
        "",
        "One page's band on PostgreSQL (`EXPLAIN ANALYZE` of ~1,000 events from the middle of the feed):",
        "",
        "| index state | plan | heap pages read | of the table's | time |",
        "|---|---|--:|--:|--:|",
    ]
    for state, label, _ in PG_STATES:
        p = results["postgresql"][f"plan_{state}"]
        lines.append(
            f"| {label} | {' → '.join(p['nodes'])} | {p['heap_pages']} | {p['table_pages']} | {p['ms']:.2f} ms |"
        )
    lines += [
        "",
        "**What the feed adds to an append** (the single-event append statement with all of the "
        "feed — its number, index and triggers —, with its storage only — number and index —, and "
        "without it; raw, one event per transaction, alternating blocks, median; the differences also "
        "against a whole `EventStore.append` of this run; bytes/event: what the table and its indexes "
        "grew by per event after a 200-event warm-up, and apart what they cost once). Target ≤ 10%.",
        "",
        "| backend | with feed | storage only | without | × all | × storage | Δ all, storage ÷ `EventStore.append` "
        "| bytes/event with | without | + | once, at 200 events |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for b in ("postgresql", "sqlite"):
        a = results[b]["append"]
        lines.append(
            f"| {b} | {a['all_us']:.0f} µs | {a['storage_us']:.0f} µs | {a['none_us']:.0f} µs | "
            f"{a['all_ratio']:.3f} | {a['storage_ratio']:.3f} | "
            f"{100 * a['all_delta_vs_store_append']:+.1f}%, {100 * a['storage_delta_vs_store_append']:+.1f}% "
            f"of {results[b]['store_append_us']:.0f} µs | "
            f"{a['bytes_with']:.0f} | {a['bytes_without']:.0f} | "
            f"{100 * (a['bytes_with'] / a['bytes_without'] - 1):+.1f}% | "
            f"{(a['fixed_with'] - a['fixed_without']) / 1024:+.0f} KiB |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks feed", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    ap.add_argument("--no-record", action="store_true", help="do not rewrite RESULTS.md")
    args = ap.parse_args(argv)
    if not os.environ.get("EVENTSTORE_TEST_PG_URL"):
        print("EVENTSTORE_TEST_PG_URL is not set: run under scripts/with-postgres")
        return 2
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "machine": machine(["sqlalchemy", "psycopg"]),
    }
    with tempfile.TemporaryDirectory() as d:
        for dialect in ("postgresql", "sqlite"):
            results[dialect] = run_backend(dialect, args.quick, Path(d))
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))
    section = render(results)
    print(section)
    if not args.no_record:
        record_section(RESULTS, SECTION, section)
    return 0
