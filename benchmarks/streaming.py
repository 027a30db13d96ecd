"""Streaming turns: many sessions streaming replies at once, three ways to persist them.

W = 1 / 16 / 64 concurrent sessions (one thread or task each) stream turns of a ``send``, a
``message-start``, 80 ``text-delta`` parts, a ``tool-call``, its ``tool-result`` and a
``finish`` (85 events per turn), on PostgreSQL, through:

- ``turn``: ``store.turn(...)`` — group commit of every open turn, deltas durable within
  ``max_delay`` (20 ms), step-ending parts before ``write`` returns;
- ``aturn``: the same through the async twin (``AsyncEventStore.turn``), W tasks on one
  event loop instead of W threads;
- ``raw``: raw psycopg, one connection per session, each part ``INSERT`` + ``COMMIT`` into a
  bare table (the limit for a writer that commits each part on its own);
- ``append``: ``EventStore.append`` of each part (one transaction each).

Two modes: *saturating* (every session writes as fast as it can: events/s, and commits/s
from the server's ``pg_stat_database``) and *paced* (50 parts/s per session: p50 / p99 time
from ``write`` to durable, and client CPU per event). Then a crash check: a child process
streams 16 turns, reports every event ``flush`` acknowledged, is killed with SIGKILL, and
every acknowledged event must be in the database (then ``recover`` closes every turn).

``python -m benchmarks streaming [--seconds S] [--writers 1,16,64] [--no-record]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks._common import count_events, machine, record_section
from benchmarks.peers.base import db_name, drop_database, fresh_database, pg_size, pg_url
from benchmarks.peers.raw_psycopg import DDL as RAW_DDL
from benchmarks.peers.raw_psycopg import INSERT as RAW_INSERT
from eventstore import EventStore
from eventstore.engine.engine import Engine
from eventstore.engine.async_bridge import run as run_in_greenlet
from eventstore.engine.async_turns import AsyncStreamingTurn, AsyncTurnWriter
from eventstore.engine.turns import StreamingTurn, TurnWriter

__all__ = ["main"]

RESULTS = Path(__file__).with_name("RESULTS.md")
DELTAS = 80
RATE = 50.0  # parts per second per session, paced mode
MAX_DELAY = 0.02
WARMUP = 1.0  # seconds of each paced run left out of the steady-state p99


def turn_parts(n: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The send and the 84 parts of turn ``n``."""
    mid = f"a-{n}"
    parts: list[dict[str, Any]] = [{"type": "message-start", "messageId": mid}]
    parts += [
        {"type": "text-delta", "messageId": mid, "text": f"word{i} of the streamed reply "}
        for i in range(DELTAS)
    ]
    parts += [
        {
            "type": "tool-call",
            "messageId": mid,
            "id": f"c-{n}",
            "name": "add_to_cart",
            "input": {"slug": "mug", "qty": 2},
        },
        {"type": "tool-result", "id": f"c-{n}", "output": {"ok": True}},
        {"type": "finish", "reason": "stop"},
    ]
    return {"type": "send", "id": f"u-{n}", "text": "Add two mugs to the cart"}, parts


class Pacer:
    """Sleeps until the next tick of ``rate`` per second (no sleep when ``rate`` is 0)."""

    def __init__(self, rate: float) -> None:
        self.step = 1.0 / rate if rate else 0.0
        self.next = time.perf_counter()

    def wait(self) -> None:
        delay = self._delay()
        if delay > 0:
            time.sleep(delay)

    async def await_tick(self) -> None:
        delay = self._delay()
        if delay > 0:
            await asyncio.sleep(delay)

    def _delay(self) -> float:
        if not self.step:
            return 0.0
        self.next += self.step
        return self.next - time.perf_counter()


class Latencies:
    """Write-to-durable samples, shared by the session threads: (write time, seconds)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: list[tuple[float, float]] = []
        self.start = time.perf_counter()

    def add(self, values: Sequence[tuple[float, float]]) -> None:
        with self.lock:
            self.samples.extend(values)

    def steady(self) -> list[float]:
        """The samples written after the first WARMUP seconds (connections being opened and
        sessions created at once by every thread)."""
        return [d for t, d in self.samples if t - self.start >= WARMUP]


# -- the three targets ---------------------------------------------------------------------


def run_raw(url: str, sid: str, stop: threading.Event, rate: float, lat: Latencies | None) -> None:
    seq = 0
    with psycopg.connect(url, autocommit=True) as conn:
        n = 0
        while not stop.is_set():
            n += 1
            send, parts = turn_parts(n)
            pace = Pacer(rate)
            mine: list[float] = []
            for action in [send] + [{"type": "part", "part": p} for p in parts]:
                pace.wait()
                seq += 1
                t0 = time.perf_counter()
                conn.execute(RAW_INSERT, (sid, seq, action["type"], Jsonb(action)))
                mine.append((t0, time.perf_counter() - t0))
                if stop.is_set():
                    break
            if lat is not None:
                lat.add(mine)


def run_append(
    store: EventStore, sid: str, stop: threading.Event, rate: float, lat: Latencies | None
) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        send, parts = turn_parts(n)
        pace = Pacer(rate)
        mine: list[float] = []
        for action in [send] + [{"type": "part", "part": p} for p in parts]:
            pace.wait()
            t0 = time.perf_counter()
            store.append(sid, [action])
            mine.append((t0, time.perf_counter() - t0))
            if stop.is_set():
                break
        if lat is not None:
            lat.add(mine)


class DurableClock:
    """When each (session pk, version) became durable: wraps the group commit's storage call."""

    def __init__(self, engine: Engine) -> None:
        self.at: dict[int, list[tuple[int, float]]] = {}
        self.flushes: list[float] = []
        self.lock = threading.Lock()
        real = engine.storage.append

        def timed(batches: Any) -> list[bool]:
            t0 = time.perf_counter()
            out = real(batches)
            now = time.perf_counter()
            self.flushes.append(now - t0)
            with self.lock:
                for b, ok in zip(batches, out):
                    if ok and b.rows:
                        self.at.setdefault(b.session_pk, []).append((b.rows[-1].version, now))
            return out

        engine.storage.append = timed  # type: ignore[method-assign]

    def durable_at(self, pk: int, version: int) -> float | None:
        with self.lock:
            for v, t in self.at.get(pk, []):
                if v >= version:
                    return t
        return None


def run_turn(
    writer: TurnWriter,
    sid: str,
    stop: threading.Event,
    rate: float,
    lat: Latencies | None,
    clock: DurableClock | None,
    unmatched: list[tuple[str, list[tuple[int, int, float]]]],
) -> None:
    n = 0
    written: list[tuple[int, int, float]] = []  # (pk, version, write time)
    while not stop.is_set():
        n += 1
        send, parts = turn_parts(n)
        pace = Pacer(rate)
        with StreamingTurn(writer, sid, send, actor=None, max_delay=MAX_DELAY) as turn:
            v = turn.version
            pk = 0
            for p in parts:
                pace.wait()
                t0 = time.perf_counter()
                turn.write(p)
                v += 1
                if clock is not None:
                    written.append((pk, v, t0))
                if stop.is_set() and p["type"] == "text-delta":
                    break
    if lat is not None and clock is not None:
        # Matched to the flushes later, outside the timed window: the matching is the
        # benchmark's bookkeeping, not the client CPU a turn costs.
        unmatched.append((sid, written))


def match_durable(
    pks: dict[str, int],
    clock: DurableClock,
    lat: Latencies,
    unmatched: list[tuple[str, list[tuple[int, int, float]]]],
) -> None:
    """Latencies of the parts :func:`run_turn` wrote: write time to the flush that held them."""
    for sid, written in unmatched:
        pk = pks[sid]
        lat.add([(t0, t - t0) for _, v, t0 in written if (t := clock.durable_at(pk, v)) is not None])


async def run_aturn(
    writer: AsyncTurnWriter,
    sid: str,
    stop: threading.Event,
    rate: float,
    clock: DurableClock | None,
    unmatched: list[tuple[str, list[tuple[int, int, float]]]],
) -> None:
    """:func:`run_turn` as an asyncio task, through the async twin's turns."""
    n = 0
    written: list[tuple[int, int, float]] = []
    while not stop.is_set():
        n += 1
        send, parts = turn_parts(n)
        pace = Pacer(rate)
        async with AsyncStreamingTurn(writer, sid, send, actor=None, max_delay=MAX_DELAY) as turn:
            v = turn.version
            for p in parts:
                await pace.await_tick()
                t0 = time.perf_counter()
                await turn.write(p)
                v += 1
                if clock is not None:
                    written.append((0, v, t0))
                if stop.is_set() and p["type"] == "text-delta":
                    break
    if clock is not None:
        unmatched.append((sid, written))


def run_aturns(
    engine: Engine,
    writers: int,
    stop: threading.Event,
    rate: float,
    clock: DurableClock | None,
    unmatched: list[tuple[str, list[tuple[int, int, float]]]],
    pks: dict[str, int],
) -> None:
    """Every session's task on one event loop (this thread's); the sessions' keys after."""

    async def main() -> None:
        writer = AsyncTurnWriter(engine)
        sids = [f"s{i}" for i in range(writers)]
        try:
            await asyncio.gather(*(run_aturn(writer, sid, stop, rate, clock, unmatched) for sid in sids))
            for sid in sids:
                pks[sid] = (await run_in_greenlet(engine.session_row, sid)).pk
        finally:
            await writer.close()
            await run_in_greenlet(engine.close)

    asyncio.run(main())


# -- one run -------------------------------------------------------------------------------


def xact_commits(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def run_one(target: str, writers: int, seconds: float, rate: float) -> dict[str, Any]:
    """One target at one concurrency in one mode: events/s, commits/s, CPU, latencies."""
    tag = f"{target}_{writers}_{'paced' if rate else 'sat'}"
    name = db_name("stream", tag)
    fresh_database(name)
    url = pg_url(name)
    lat = Latencies() if rate else None
    stop = threading.Event()
    clock: DurableClock | None = None
    unmatched: list[tuple[str, list[tuple[int, int, float]]]] = []
    closers: list[Callable[[], None]] = []
    if target == "raw":
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(RAW_DDL)

        def work(i: int) -> None:
            run_raw(url, f"s{i}", stop, rate, lat)

    elif target == "append":
        store = EventStore(pg_url(name, driver=True), pool_size=writers + 1)
        store.migrate()
        closers.append(store.close)

        def work(i: int) -> None:
            run_append(store, f"s{i}", stop, rate, lat)

    elif target == "turn":
        engine = Engine(pg_url(name, driver=True), pool_size=writers + 1)
        engine.migrate()
        clock = DurableClock(engine) if rate else None
        writer = TurnWriter(engine)
        closers += [writer.close, engine.close]

        def work(i: int) -> None:
            run_turn(writer, f"s{i}", stop, rate, lat, clock, unmatched)

    else:
        with EventStore(pg_url(name, driver=True)) as store:
            store.migrate()
        engine = Engine(pg_url(name, driver=True), pool_size=writers + 1, use_asyncio=True)
        clock = DurableClock(engine) if rate else None

        def work(i: int) -> None:
            run_aturns(engine, writers, stop, rate, clock, unmatched, pks)

    pks: dict[str, int] = {}
    commits0 = xact_commits(url)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(1 if target == "aturn" else writers)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    if lat is not None:
        lat.start = t0
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if lat is not None and clock is not None:
        if target == "turn":
            pks = {sid: writer.engine.session_row(sid).pk for sid, _ in unmatched}
        match_durable(pks, clock, lat, unmatched)
    for close in closers:
        close()
    time.sleep(1.1)  # the server's statistics are flushed about once a second
    events = count_events(url)
    commits = xact_commits(url) - commits0
    out: dict[str, Any] = {
        "target": target,
        "writers": writers,
        "mode": "paced" if rate else "saturating",
        "events": events,
        "events_per_s": events / wall,
        "commits_per_s": commits / wall,
        "cpu_ms_per_event": 1000 * cpu / max(events, 1),
    }
    if lat is not None and lat.samples:
        q = statistics.quantiles([d for _, d in lat.samples], n=100)
        out["p50_ms"], out["p99_ms"] = 1000 * q[49], 1000 * q[98]
        out["samples"] = len(lat.samples)
        steady = lat.steady()
        if len(steady) > 1:
            out["p99_steady_ms"] = 1000 * statistics.quantiles(steady, n=100)[98]
    if target in ("turn", "aturn") and rate and clock is not None and len(clock.flushes) > 1:
        q = statistics.quantiles(clock.flushes, n=100)
        out["flush_p50_ms"], out["flush_p99_ms"] = 1000 * q[49], 1000 * q[98]
    if not rate:
        # The live data (VACUUM FULL): the heads' updates leave dead row versions in
        # `sessions` that an ordinary VACUUM reuses but does not give back.
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM FULL")
        out["bytes_per_event"] = pg_size(name) / max(events, 1)
    drop_database(name)
    return out


# -- kill -9 -------------------------------------------------------------------------------


def child(url: str, sessions: int) -> None:
    """Stream turns on ``sessions`` sessions until killed; print each acknowledged head."""
    store = EventStore(url, pool_size=sessions + 1)
    out = threading.Lock()

    def work(i: int) -> None:
        sid = f"k{i}"
        n = 0
        while True:
            n += 1
            send, parts = turn_parts(n)
            with store.turn(sid, send, max_delay=MAX_DELAY) as turn:
                for j, p in enumerate(parts):
                    turn.write(p)
                    if j % 10 == 9:
                        v = turn.flush()
                        with out:
                            print(f"{sid} {v}", flush=True)

    for i in range(sessions):
        threading.Thread(target=work, args=(i,), daemon=True).start()
    threading.Event().wait()


def kill_check(seconds: float, sessions: int = 16) -> dict[str, Any]:
    """Kill a streaming process with SIGKILL; every acknowledged event must be stored."""
    name = db_name("stream", "kill")
    fresh_database(name)
    url = pg_url(name, driver=True)
    with EventStore(url) as store:
        store.migrate()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.streaming", "--child", url, str(sessions)],
        stdout=subprocess.PIPE,
        text=True,
    )
    acked: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        sid, v = line.split()
        acked[sid] = max(acked.get(sid, 0), int(v))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    lost = 0
    with EventStore(url) as store:
        for sid, v in acked.items():
            versions = [e.version for e in store.history(sid, upto=v)]
            lost += v - len(versions)
        recovered = 0
        time.sleep(0.6)
        for info in store.sessions():
            if store.recover(info.id, stale_after=0.5) is not None:
                recovered += 1
        ok = store.verify().ok
    drop_database(name)
    return {
        "acknowledged": sum(acked.values()),
        "lost": lost,
        "sessions": len(acked),
        "recovered": recovered,
        "verify_ok": ok,
    }


# -- the report ----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"machine": machine(["psycopg", "sqlalchemy"]), "runs": []}
    res["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    for rate in (0.0, RATE):
        for w in args.writers:
            for target in ("raw", "append", "turn", "aturn"):
                r = run_one(target, w, args.seconds, rate)
                print(json.dumps(r), flush=True)
                res["runs"].append(r)
    res["kill"] = kill_check(args.kill_seconds)
    print(json.dumps(res["kill"]), flush=True)
    return res


def _row(runs: list[dict[str, Any]], target: str, w: int, mode: str) -> dict[str, Any]:
    return next(
        r for r in runs if r["target"] == target and r["writers"] == w and r["mode"] == mode
    )


def markdown(res: dict[str, Any], writers: list[int]) -> str:
    runs = res["runs"]
    m = res["machine"]
    lines = [
        "## Streaming turns",
        "",
        f"`python -m benchmarks streaming` on {res['date']}; {m['uname']}, {m['nproc']} CPUs, Python "
        f"{m['python']}, psycopg {m['packages']['psycopg']}; PostgreSQL 15 from `scripts/with-postgres` "
        "(fsync on) on the same machine. W sessions, one thread (or task) each, stream turns of 85 "
        "events (send, message-start, 80 text deltas, tool-call, tool-result, finish). `turn`: "
        f"`store.turn` with max_delay {int(MAX_DELAY * 1000)} ms (group commit), a thread per session; "
        "`aturn`: the async twin's `turn`, a task per session on one event loop; `raw`: raw psycopg, "
        "INSERT + COMMIT per part into a bare table; `append`: `EventStore.append` per part. Ratios "
        "are against `raw` in the same run.",
        "",
        "Saturating (every session writes as fast as it can):",
        "",
        "| W | raw events/s | append events/s (× raw) | turn events/s (× raw) | aturn events/s (× raw) "
        "| commits/s raw / append / turn / aturn | client CPU/event raw / append / turn / aturn "
        "| bytes/event raw / append / turn |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for w in writers:
        raw, app, turn, aturn = (
            _row(runs, t, w, "saturating") for t in ("raw", "append", "turn", "aturn")
        )
        lines.append(
            f"| {w} | {raw['events_per_s']:,.0f} | {app['events_per_s']:,.0f} "
            f"({app['events_per_s'] / raw['events_per_s']:.2f}×) | **{turn['events_per_s']:,.0f} "
            f"({turn['events_per_s'] / raw['events_per_s']:.1f}×)** | **{aturn['events_per_s']:,.0f} "
            f"({aturn['events_per_s'] / raw['events_per_s']:.1f}×)** | {raw['commits_per_s']:,.0f} / "
            f"{app['commits_per_s']:,.0f} / {turn['commits_per_s']:,.0f} / {aturn['commits_per_s']:,.0f} | "
            f"{raw['cpu_ms_per_event']:.3f} / {app['cpu_ms_per_event']:.3f} / {turn['cpu_ms_per_event']:.3f} / "
            f"{aturn['cpu_ms_per_event']:.3f} ms | "
            f"{raw.get('bytes_per_event', 0):.0f} / {app.get('bytes_per_event', 0):.0f} / "
            f"{turn.get('bytes_per_event', 0):.0f} ({turn.get('bytes_per_event', 0) / max(raw.get('bytes_per_event', 1), 1):.2f}×) |"
        )
    lines += [
        "",
        f"Paced ({RATE:.0f} parts/s per session): time from `write` to durable (for `raw` and "
        "`append` the call itself; for `turn`, until the group commit holding the part returned), "
        f"and client CPU per event; the last column leaves out the first {WARMUP:.0f} s of each run, "
        "while every session opens its connection (`raw`, `append`) or its session and first turn "
        "(`turn`, `aturn`) at once:",
        "",
        "| W | raw p50 / p99 | append p50 / p99 | turn p50 / p99 | aturn p50 / p99 "
        "| client CPU/event raw / append / turn / aturn "
        "| p99 after the first second raw / append / turn / aturn |",
        "|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for w in writers:
        raw, app, turn, aturn = (_row(runs, t, w, "paced") for t in ("raw", "append", "turn", "aturn"))
        lines.append(
            f"| {w} | {raw.get('p50_ms', 0):.2f} / {raw.get('p99_ms', 0):.2f} ms | "
            f"{app.get('p50_ms', 0):.2f} / {app.get('p99_ms', 0):.2f} ms | "
            f"**{turn.get('p50_ms', 0):.2f} / {turn.get('p99_ms', 0):.2f} ms** | "
            f"**{aturn.get('p50_ms', 0):.2f} / {aturn.get('p99_ms', 0):.2f} ms** | "
            f"{raw['cpu_ms_per_event']:.3f} / {app['cpu_ms_per_event']:.3f} / "
            f"**{turn['cpu_ms_per_event']:.3f} / {aturn['cpu_ms_per_event']:.3f} ms** | "
            f"{raw.get('p99_steady_ms', 0):.2f} / {app.get('p99_steady_ms', 0):.2f} / "
            f"**{turn.get('p99_steady_ms', 0):.2f} / {aturn.get('p99_steady_ms', 0):.2f} ms** |"
        )
    k = res["kill"]
    lines += [
        "",
        f"Kill -9: a process streaming {k['sessions']} turns was killed with SIGKILL after "
        f"{k['acknowledged']:,} acknowledged events (`flush` returned); **{k['lost']} lost**; "
        f"`recover` closed {k['recovered']} interrupted turns and `verify` was "
        f"{'ok' if k['verify_ok'] else 'NOT ok'}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the streaming benchmark and record it in RESULTS.md."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child(argv[1], int(argv[2]))
        return 0
    p = argparse.ArgumentParser(
        prog="python -m benchmarks streaming", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--seconds", type=float, default=4.0, help="seconds per run")
    p.add_argument("--kill-seconds", type=float, default=3.0, help="seconds before the SIGKILL")
    p.add_argument("--writers", default="1,16,64", help="concurrent sessions, comma-separated")
    p.add_argument("--no-record", action="store_true", help="do not rewrite benchmarks/RESULTS.md")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.writers = [int(w) for w in args.writers.split(",")]
    res = run(args)
    out = Path(__file__).with_name("out")
    out.mkdir(exist_ok=True)
    (out / "streaming.json").write_text(json.dumps(res, indent=2))
    md = markdown(res, args.writers)
    print(md)
    if not args.no_record:
        record_section(args.results, "## Streaming turns", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
