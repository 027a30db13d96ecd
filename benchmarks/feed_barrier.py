"""Feed barrier benchmark: delivery with a stranger's idle transaction open, and what the barrier costs.

Run (PostgreSQL from ``EVENTSTORE_TEST_PG_URL``, as ``scripts/with-postgres`` exports it)::

    scripts/with-postgres .venv/bin/python -m benchmarks feed_barrier            # ~1 min
    scripts/with-postgres .venv/bin/python -m benchmarks feed_barrier --quick    # ~30 s
    ... --no-record      # do not rewrite the "## Feed barrier" section of benchmarks/RESULTS.md

Two measurements, PostgreSQL only (SQLite has no barrier: writers take turns):

1. **Commit-to-follower latency** (:func:`benchmarks.feed.latency`: writers each append one
   event per transaction to their own session, paced; one ``store.feed()`` follower in the
   writers' process) with nothing else open, and with an idle transaction that took an id
   (``BEGIN; SELECT pg_current_xact_id()``) held open throughout: in another database of
   the cluster under a role with no privilege, and in this database. ``missing`` counts the
   events the follower had not received when the run ended (an event never delivered
   while the stranger's transaction stays open shows up there, not in the percentiles).
2. **One barrier read**: the statement a feed page runs for its barrier alone
   (``SELECT <barrier>``), the cluster's oldest transaction (``pg_snapshot_xmin``, the
   barrier before the writers' barrier) against the oldest transaction that can still write
   an event (:mod:`eventstore.storage.postgres.feed_barrier`), alternating, median and p99 of many reads,
   idle and with 16 writers appending.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from benchmarks._common import machine, record_section
from benchmarks.feed import latency
from benchmarks.store import _pg_schema
from eventstore import EventStore

try:
    from sqlalchemy.dialects.postgresql.psycopg import dialect

    from eventstore.storage.postgres.feed_barrier import writers_barrier

    # Its constants are inlined: the statement has no parameters.
    WRITERS_BARRIER_SQL = f"({writers_barrier().element.compile(dialect=dialect())})"
except ImportError:
    try:  # a checkout from before the barrier was declared as Core: its text
        from eventstore.storage.postgres.feed_barrier import WRITERS_BARRIER_SQL
    except ImportError:  # a checkout from before the writers' barrier: its latency only
        WRITERS_BARRIER_SQL = ""

__all__ = ["main"]

SECTION = "## Feed barrier"
OUT = Path(__file__).parent / "out" / "feed_barrier.json"
RESULTS = Path(__file__).parent / "RESULTS.md"
CLUSTER_XMIN_SQL = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint"


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def _stranger(admin: str, where: str, url: str) -> Iterator[None]:
    """An idle transaction holding an id: ``other-db`` (a zero-privilege role in a database
    of its own), ``this-db`` (in the store's database), or ``none``."""
    if where == "none":
        yield
        return
    suffix = uuid.uuid4().hex[:8]
    admin_conn = psycopg.connect(_dsn(admin), autocommit=True)
    if where == "other-db":
        admin_conn.execute(f'CREATE DATABASE "bstr_{suffix}"')
        admin_conn.execute(f'CREATE ROLE "bstr_{suffix}" LOGIN')
        dsn = make_url(_dsn(admin)).set(database=f"bstr_{suffix}", username=f"bstr_{suffix}", password=None)
        conn = psycopg.connect(dsn.render_as_string(hide_password=False))
    else:
        conn = psycopg.connect(_dsn(url))
    conn.execute("SELECT pg_current_xact_id()")
    try:
        yield
    finally:
        conn.close()
        if where == "other-db":
            admin_conn.execute(f'DROP DATABASE "bstr_{suffix}" WITH (FORCE)')
            admin_conn.execute(f'DROP ROLE "bstr_{suffix}"')
        admin_conn.close()


def barrier_reads(url: str, reads: int, writers: int) -> dict[str, Any]:
    """Median and p99 microseconds of one barrier read, each expression, alternating."""
    times: dict[str, list[float]] = {"cluster_xmin": [], "can_write": []}
    stop = threading.Event()

    def write(w: int, store: EventStore) -> None:
        while not stop.is_set():
            store.append(f"bar-{w}", [{"type": "stop"}])

    with EventStore(url) as store:
        threads = [threading.Thread(target=write, args=(w, store)) for w in range(writers)]
        for t in threads:
            t.start()
        try:
            with psycopg.connect(_dsn(url), autocommit=True) as conn:
                for _ in range(reads):
                    for name, sql in (("cluster_xmin", CLUSTER_XMIN_SQL), ("can_write", WRITERS_BARRIER_SQL)):
                        t0 = time.perf_counter()
                        conn.execute(f"SELECT {sql}").fetchone()
                        times[name].append(time.perf_counter() - t0)
        finally:
            stop.set()
            for t in threads:
                t.join()
    out: dict[str, Any] = {"writers": writers}
    for name, ts in times.items():
        ts.sort()
        out[name] = {
            "p50_us": 1e6 * statistics.median(ts),
            "p99_us": 1e6 * ts[min(len(ts) - 1, int(len(ts) * 0.99))],
        }
    return out


def run(quick: bool) -> dict[str, Any]:
    admin = os.environ["EVENTSTORE_TEST_PG_URL"]
    seconds = 2.0 if quick else 5.0
    res: dict[str, Any] = {"latency": [], "barrier": []}
    with _pg_schema(admin) as url:
        with EventStore(url) as store:
            store.migrate()
            for where in ("none", "other-db", "this-db"):
                for writers in (1, 16):
                    with _stranger(admin, where, url):
                        try:
                            row = latency(store, url, writers, seconds, elsewhere=False)
                        except IndexError:  # the follower received nothing at all
                            row = {"writers": writers, "events": "-", "missing": "all"}
                            row.update(dict.fromkeys(("p50_ms", "p99_ms", "max_ms"), float("inf")))
                    row["stranger"] = where
                    res["latency"].append(row)
                    print(json.dumps(row), flush=True)
        for writers in (0, 16) if WRITERS_BARRIER_SQL else ():
            row = barrier_reads(url, 500 if quick else 2000, writers)
            res["barrier"].append(row)
            print(json.dumps(row), flush=True)
    return res


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        SECTION,
        "",
        f"`python -m benchmarks feed_barrier{' --quick' if results['quick'] else ''}` on {results['date']}, "
        f"{m['nproc']} CPUs, Python {m['python']}, PostgreSQL on the same machine.",
        "",
        "**Commit to follower with a stranger's idle transaction open** (`BEGIN; SELECT pg_current_xact_id()` "
        "held for the whole run; one in-process `store.feed()` follower; writers paced as in the feed "
        "benchmark). `missing`: events not delivered by the end of the run.",
        "",
        "| idle transaction | writers | events | missing | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    names = {"none": "none", "other-db": "another database, no privileges", "this-db": "this database"}
    for r in results["latency"]:
        lines.append(
            f"| {names[r['stranger']]} | {r['writers']} | {r['events']} | {r['missing']} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} |"
        )
    lines += [
        "",
        "**One barrier read** (`SELECT <barrier>` alone, autocommit, alternating; µs).",
        "",
        "| writers appending | cluster xmin p50 | p99 | writers' barrier p50 | p99 |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in results["barrier"]:
        a, b = r["cluster_xmin"], r["can_write"]
        lines.append(f"| {r['writers']} | {a['p50_us']:.0f} | {a['p99_us']:.0f} | {b['p50_us']:.0f} | {b['p99_us']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks feed_barrier", description=__doc__.split("\n")[0])
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
        **run(args.quick),
    }
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))
    section = render(results)
    print(section)
    if not args.no_record:
        record_section(RESULTS, SECTION, section)
    return 0
