"""Async store vs the sync store in a thread pool vs raw psycopg async, W concurrent writers.

What an asyncio chat server sees: W tasks of one event loop each append one event per
call (a streamed part) to a session of their own, for a fixed time. Three targets, in
the same run, on the same PostgreSQL server:

- ``AsyncEventStore`` (pool of W connections), awaited directly by the tasks;
- ``EventStore`` (pool of W connections), each append pushed through a thread pool of W
  workers with ``loop.run_in_executor`` — what a server must do without the async twin;
- raw psycopg ``AsyncConnection``s (one per task, autocommit) inserting into a bare table:
  the limit, no library in between.

Rounds rotate the order of the targets; figures are medians over rounds. Client CPU per
append is this process's CPU time (every thread) divided by the appends made.

Run: ``scripts/with-postgres .venv/bin/python -m benchmarks async_store``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks._common import machine, record_section
from eventstore import AsyncEventStore, EventStore
from eventstore.samples import chat_session

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
OUT = HERE / "out" / "async_store.json"
SECTION = "## Async store"

RAW_DDL = """
CREATE TABLE raw_events (
    session_id text NOT NULL,
    seq        bigint NOT NULL,
    type       text NOT NULL,
    data       jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
)
"""
RAW_INSERT = "INSERT INTO raw_events (session_id, seq, type, data) VALUES (%s, %s, %s, %s)"

#: The streamed workload every writer replays: a realistic chat, one action per append.
ACTIONS = chat_session(60, seed=3)

#: ``append(task, session, i)``: the task's i-th append to its session.
Writer = Callable[[int, str, int], Awaitable[None]]


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextmanager
def _schema(admin_url: str) -> Iterator[str]:
    """A fresh schema; yields a URL whose search_path is it."""
    schema = f"bench_async_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_dsn(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in admin_url else "?"
    try:
        yield f"{admin_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(_dsn(admin_url), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def _drive(writers: int, seconds: float, append: Writer) -> int:
    """W tasks appending until the deadline; the number of appends made."""
    deadline = time.perf_counter() + seconds
    counts = [0] * writers

    async def task(w: int) -> None:
        sid = f"w{w}-{uuid.uuid4().hex[:8]}"
        i = 0
        while time.perf_counter() < deadline:
            await append(w, sid, i)
            i += 1
        counts[w] = i

    await asyncio.gather(*(task(w) for w in range(writers)))
    return sum(counts)


def _loop_thread_schedstat() -> tuple[int, int]:
    """Nanoseconds the calling thread spent on a CPU and waiting in a run queue (Linux)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):
        return 0, 0


async def _measure(writers: int, seconds: float, append: Writer) -> dict[str, float]:
    await _drive(writers, min(0.5, seconds / 4), append)  # connect, warm caches
    cpu0, t0, s0 = time.process_time(), time.perf_counter(), _loop_thread_schedstat()
    n = await _drive(writers, seconds, append)
    cpu, wall, s1 = time.process_time() - cpu0, time.perf_counter() - t0, _loop_thread_schedstat()
    return {
        "appends": n,
        "per_s": n / wall,
        "cpu_ms": 1000 * cpu / max(n, 1),
        # The event loop's thread: share of the time it ran, and waited for a CPU to run on
        # (together ≈ 1: the loop was never idle; its work, not the database, set the pace).
        "loop_on_cpu": (s1[0] - s0[0]) / 1e9 / wall,
        "loop_waiting": (s1[1] - s0[1]) / 1e9 / wall,
    }


def _action(i: int) -> dict[str, Any]:
    return ACTIONS[i % len(ACTIONS)]


async def _async_store(url: str, writers: int, seconds: float) -> dict[str, float]:
    async with AsyncEventStore(url, pool_size=writers, max_overflow=0) as store:

        async def append(_w: int, sid: str, i: int) -> None:
            await store.append(sid, [_action(i)])

        return await _measure(writers, seconds, append)


async def _sync_in_threads(url: str, writers: int, seconds: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    with EventStore(url, pool_size=writers, max_overflow=0) as store, ThreadPoolExecutor(writers) as pool:

        async def append(_w: int, sid: str, i: int) -> None:
            await loop.run_in_executor(pool, partial(store.append, sid, [_action(i)]))

        return await _measure(writers, seconds, append)


async def _raw(url: str, writers: int, seconds: float) -> dict[str, float]:
    dsn = _dsn(url)
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(writers)]
    try:

        async def append(w: int, sid: str, i: int) -> None:
            a = _action(i)
            await conns[w].execute(RAW_INSERT, (sid, i + 1, a["type"], Jsonb(a)))

        return await _measure(writers, seconds, append)
    finally:
        for c in conns:
            await c.close()


FIGURES = ("per_s", "cpu_ms", "loop_on_cpu", "loop_waiting")

TARGETS: dict[str, Callable[[str, int, float], Awaitable[dict[str, float]]]] = {
    "async": _async_store,
    "sync": _sync_in_threads,
    "raw": _raw,
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every W, every target, ``args.rounds`` rotated rounds; medians per cell."""
    cells: dict[str, dict[str, list[dict[str, float]]]] = {}
    load_before = os.getloadavg()[0]
    with _schema(args.pg_url) as url:
        with EventStore(url) as store:
            store.migrate()
        with psycopg.connect(_dsn(url), autocommit=True) as conn:
            conn.execute(RAW_DDL)
        for w in args.writers:
            names = list(TARGETS)
            cells[str(w)] = {n: [] for n in names}
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    fig = asyncio.run(TARGETS[name](url, w, args.seconds))
                    cells[str(w)][name].append(fig)
                    print(
                        f"W={w} round {r} {name}: {fig['per_s']:.0f}/s, {fig['cpu_ms']:.3f} ms CPU/append, "
                        f"loop thread {fig['loop_on_cpu']:.0%} running + {fig['loop_waiting']:.0%} waiting",
                        flush=True,
                    )
    med = {
        w: {
            n: {k: statistics.median(f[k] for f in figs) for k in FIGURES}
            for n, figs in by.items()
        }
        for w, by in cells.items()
    }
    return {
        "machine": machine(["sqlalchemy", "psycopg", "greenlet", "aiosqlite"]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": args.seconds,
        "rounds": args.rounds,
        # The machine's 1-minute load average before and after: other jobs share its CPUs.
        "load": [load_before, os.getloadavg()[0]],
        "median": med,
        "cells": cells,
    }


def render(res: dict[str, Any], command: str) -> str:
    """The RESULTS.md section."""
    m = res["machine"]
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    lines = [
        SECTION,
        "",
        f"`{command}` — {res['date']}; {m['uname']}, {m['nproc']} CPUs, Python {m['python']}; {pk}.",
        "PostgreSQL from `scripts/with-postgres` on the same machine. W tasks of one event loop, each",
        "appending one event per call to its own session for "
        f"{res['seconds']:g} s; medians of {res['rounds']} rounds with the targets' order rotated.",
        "Throughput ratios are against the figures of the same run; CPU is this process's (all threads).",
        f"The machine was shared with other jobs: load average {res['load'][0]:.1f} before the run, "
        f"{res['load'][1]:.1f} after; rates move widely with the load from run to run, the ratios less.",
        "",
        "| W | async store (appends/s) | sync store in a thread pool | raw psycopg async "
        "| async ÷ thread-pool sync | async ÷ raw | CPU/append async | CPU/append sync | CPU/append raw "
        "| async loop thread: running + waiting for a CPU |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for w, by in res["median"].items():
        a, s, r = by["async"], by["sync"], by["raw"]
        lines.append(
            f"| {w} | {a['per_s']:,.0f} | {s['per_s']:,.0f} | {r['per_s']:,.0f} "
            f"| **{a['per_s'] / s['per_s']:.2f}×** | {a['per_s'] / r['per_s']:.2f}× "
            f"| {a['cpu_ms']:.3f} ms | {s['cpu_ms']:.3f} ms | {r['cpu_ms']:.3f} ms "
            f"| {a['loop_on_cpu']:.0%} + {a['loop_waiting']:.0%} |"
        )
    top = res["median"][max(res["median"], key=int)]
    a, s = top["async"], top["sync"]
    ratio = a["per_s"] / s["per_s"]
    lines += [
        "",
        f"Targets at W = {max(res['median'], key=int)}: async ≥ 1.5× the thread-pool sync store — "
        f"**{'met' if ratio >= 1.5 else 'not met'}** ({ratio:.2f}×); client CPU per append no worse than "
        f"the sync store's — **{'met' if a['cpu_ms'] <= s['cpu_ms'] else 'not met'}** "
        f"({a['cpu_ms']:.3f} ms against {s['cpu_ms']:.3f} ms).",
        "",
        "The async store commits the appends of its tasks in groups: while one transaction is in",
        "flight, the appends that arrive are planned (rows, hashes, snapshots, by the engine) and",
        "queued, and the next transaction writes them all — on PostgreSQL one statement, each session",
        "still moved only from the head it was planned on. At W = 1 nothing is ever queued: each",
        "append goes alone by the same optimistic path as the sync store's (one statement), and the",
        "difference is the thread pool's hand-off, which costs most on a busy machine. With 16 and 64",
        "writers a round trip, a statement and a commit serve a whole group, so the client CPU per",
        "append falls to a fraction of the sync store's (about 0.25 ms per append before group commit,",
        "when each append was its own transaction, and the loop's thread was then the bottleneck), and",
        "the server commits a group at once instead of one transaction per append — which is also",
        "why it keeps up with raw psycopg at W = 64, whose writers commit one row per transaction.",
        "The thread pool loses most on a loaded machine (its W threads hand the GIL to each other",
        "through the scheduler), so the ratio at W = 64 is larger on a busy machine than on an idle",
        "one; the client CPU per append is the steadier figure.",
        "",
        "The last column is the share of the time the event loop's thread was running, and runnable",
        "but waiting for a CPU (Linux schedstat); well under 100 % means it spent the rest waiting",
        "for the database.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks async_store", description=__doc__.splitlines()[0])
    p.add_argument("--pg-url", default=os.environ.get("EVENTSTORE_TEST_PG_URL"))
    p.add_argument("--writers", default="1,16,64", help="comma-separated W values")
    p.add_argument("--seconds", type=float, default=3.0, help="measured time per cell and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-record", action="store_true", help="do not rewrite benchmarks/RESULTS.md")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(list(argv or []))
    if not args.pg_url:
        p.error("needs --pg-url or EVENTSTORE_TEST_PG_URL (run under scripts/with-postgres)")
    args.writers = [int(x) for x in args.writers.split(",") if x]
    res = run(args)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(res, indent=2))
    command = "scripts/with-postgres .venv/bin/python -m benchmarks async_store" + (
        " " + " ".join(argv) if argv else ""
    )
    section = render(res, command)
    print(section)
    if not args.no_record:
        record_section(args.results, SECTION, section)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
