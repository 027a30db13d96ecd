"""Growth with sealing: bytes, appends, loads and sealing lag as the table grows.

``python -m benchmarks growth [--sessions 1000] [--turns 200] [--writers 2]
[--checkpoints 10] [--backend postgresql|sqlite]`` writes N sessions of T turns of the
``chat_session`` workload (one append per turn, ``expected_version`` set) into one
``EventStore`` with sealing on (its background sealer), from W writer threads, each taking
the next session when it has written one. Each writer writes every turn a second time,
right after, into a bare table of the same JSON (``benchmarks/peers/raw_psycopg.py`` on
PostgreSQL, a table of the same shape on SQLite): the baseline that bytes and append
times are divided by, measured in the same run, under the same load.

The sessions are written in ``--checkpoints`` equal phases. While a phase runs, a monitor
polls every ``--poll`` seconds how far each session's segments reach, and so counts the
closed turns not yet sealed (a turn closes when the append of the session's next turn
returns) and when each closed turn was sealed (its lag: seal time − close time, to within
a poll). After each phase the writers stop, the sealer is given time to drain (how long
that takes is reported), and then, on a quiet table:

- database bytes per event (tables + indexes + TOAST after ``VACUUM``; SQLite: used pages)
  and the same for the bare table;
- the head load and a checkout of the middle version of the first session written (early)
  and of the last one (late), each as a median of ``--repeats`` calls and as a ratio to
  decoding that state's JSON with orjson in the same breath (the decode is the floor a
  load could reach, and it moves with the machine's load as the load does).

Writes ``benchmarks/out/growth.json`` (``--json``) after every checkpoint, so a run that is
stopped keeps what it measured; prints a markdown table at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import queue
import sqlite3
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import create_engine, text

from benchmarks._common import machine, split_turns
from benchmarks.peers.base import db_name, fresh_database, pg_size, pg_url
from benchmarks.peers.raw_psycopg import RawPsycopg
from eventstore import EventStore
from eventstore.samples import chat_session

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "growth.json"
#: How long the sealer may take to catch up after a phase before the run goes on anyway.
DRAIN_LIMIT = 600.0


class _BareSqlite:
    """The bare-row baseline on SQLite: one row per event, the action's JSON as text."""

    DDL = (
        "CREATE TABLE IF NOT EXISTS events (session_id TEXT NOT NULL, seq INTEGER NOT NULL, "
        "type TEXT NOT NULL, data TEXT NOT NULL, created_at REAL NOT NULL, "
        "PRIMARY KEY (session_id, seq))"
    )

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=60)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(self.DDL)
        self.heads: dict[str, int] = {}

    def append(self, session: str, actions: Sequence[dict[str, Any]]) -> None:
        seq = self.heads.get(session, 0)
        now = time.time()
        rows = [(session, seq + i, a["type"], orjson.dumps(a).decode(), now) for i, a in enumerate(actions, 1)]
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", rows)
        self.conn.execute("COMMIT")
        self.heads[session] = seq + len(rows)

    def close(self) -> None:
        self.conn.close()


def _sqlite_bytes(path: str) -> int:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size, pages, free = (conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "page_count", "freelist_count"))
    return int(size * (pages - free))


class _Backend:
    """Where the run writes: eventstore's database and the bare table's, and their sizes."""

    def __init__(self, kind: str, tag: str) -> None:
        self.kind = kind
        if kind == "postgresql":
            self._tag = f"growth_{tag}"
            self._es_db = db_name("growth_es", tag)
            fresh_database(self._es_db)
            self.url = pg_url(self._es_db, driver=True)
            bare = RawPsycopg()
            bare.open(self._tag)  # a fresh database with the bare table
            self._bare_db = bare.db
            bare.close()
        else:
            folder = os.environ.get("BENCH_SQLITE_DIR") or tempfile.gettempdir()
            self._es_path = os.path.join(folder, f"growth-es-{tag}.db")
            self._bare_path = os.path.join(folder, f"growth-bare-{tag}.db")
            for base in (self._es_path, self._bare_path):
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(base + suffix):
                        os.remove(base + suffix)
            self.url = f"sqlite:///{self._es_path}"

    def bare_writer(self) -> Any:
        """A connection of one writer thread to the bare table."""
        if self.kind == "postgresql":
            bare = RawPsycopg()
            bare.open(self._tag, create=False)
            return bare
        return _BareSqlite(self._bare_path)

    def sizes(self) -> tuple[int, int]:
        """Bytes of eventstore's database and of the bare table's (after VACUUM)."""
        if self.kind == "postgresql":
            return pg_size(self._es_db), pg_size(self._bare_db)
        return _sqlite_bytes(self._es_path), _sqlite_bytes(self._bare_path)


class _Progress:
    """What the writers have done, for the monitor: each session's closed turns (their
    last version and when they closed) and, from the monitor, how far its seals reach."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # session id -> [(last version of a closed turn, monotonic close time)], oldest first
        self.closed: dict[str, list[tuple[int, float]]] = {}
        self.sealed_upto: dict[str, int] = {}
        self.lags: list[float] = []
        self.samples: list[tuple[float, int]] = []  # (time, closed turns not sealed)
        self.events = 0
        self.append_s: list[float] = []
        self.bare_s: list[float] = []

    def unsealed(self) -> int:
        with self.lock:
            return sum(
                sum(1 for last, _ in turns if last > self.sealed_upto.get(sid, 0)) for sid, turns in self.closed.items()
            )

    def seen_seals(self, upto: dict[str, int], now: float) -> None:
        with self.lock:
            for sid, last in upto.items():
                before = self.sealed_upto.get(sid, 0)
                if last <= before:
                    continue
                for end, closed_at in self.closed.get(sid, ()):
                    if before < end <= last:
                        self.lags.append(now - closed_at)
                self.sealed_upto[sid] = last


def _write_phase(store: EventStore, backend: _Backend, sessions: list[int], turns: int, writers: int, progress: _Progress) -> None:
    todo: queue.Queue[int] = queue.Queue()
    for s in sessions:
        todo.put(s)
    errors: list[BaseException] = []

    def writer() -> None:
        bare = backend.bare_writer()
        try:
            while True:
                try:
                    s = todo.get_nowait()
                except queue.Empty:
                    return
                sid = f"s{s:05d}"
                head = 0
                previous_end = 0
                with progress.lock:
                    progress.closed[sid] = []
                for turn in split_turns(chat_session(turns, seed=s)):
                    t0 = time.perf_counter()
                    head = store.append(sid, turn, expected_version=head).version
                    t1 = time.perf_counter()
                    bare.append(sid, turn)
                    t2 = time.perf_counter()
                    closed_at = time.monotonic()
                    with progress.lock:
                        progress.append_s.append(t1 - t0)
                        progress.bare_s.append(t2 - t1)
                        progress.events += len(turn)
                        if previous_end:
                            progress.closed[sid].append((previous_end, closed_at))
                    previous_end = head
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            bare.close()

    threads = [threading.Thread(target=writer, name=f"growth-writer-{i}") for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _monitor(url: str, progress: _Progress, poll: float, stop: threading.Event) -> None:
    """Poll how far each session's segments reach until ``stop`` is set."""
    engine = create_engine(url)
    try:
        t_start = time.monotonic()
        while not stop.wait(poll):
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT s.id, max(g.last_version) FROM event_segments g "
                        "JOIN sessions s ON s.pk = g.session_pk GROUP BY s.id"
                    )
                ).all()
            now = time.monotonic()
            progress.seen_seals({sid: int(last) for sid, last in rows}, now)
            progress.samples.append((now - t_start, progress.unsealed()))
    finally:
        engine.dispose()


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def _reads(store: EventStore, sid: str, repeats: int) -> dict[str, float]:
    """Head load and middle-version checkout of ``sid``: ms, and ÷ decoding its JSON."""
    head = store.head(sid)
    out: dict[str, float] = {}
    for name, version in (("head", None), ("checkout", head // 2)):
        blob = orjson.dumps(store.load(sid, version=version).to_json())
        # Interleaved call by call, so that both see the same moment of a busy machine.
        loads, decodes = [], []
        for _ in range(repeats):
            loads.append(_median_ms(lambda: store.load(sid, version=version), 1))
            decodes.append(_median_ms(lambda: orjson.loads(blob), 1))
        out[f"{name}_ms"] = statistics.median(loads)
        out[f"{name}_x_decode"] = statistics.median(a / b for a, b in zip(loads, decodes))
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    tag = f"{args.sessions}x{args.turns}"
    backend = _Backend(args.backend, tag)
    store = EventStore(backend.url)  # seal=True: the default, the background sealer
    store.migrate()
    empty_es, empty_bare = backend.sizes()
    sessions = list(range(args.sessions))
    per_phase = max(1, len(sessions) // args.checkpoints)
    phases = [sessions[i : i + per_phase] for i in range(0, len(sessions), per_phase)]
    result.update(empty_bytes={"eventstore": empty_es, "bare": empty_bare}, checkpoints=[])
    events = 0
    started = time.monotonic()
    try:
        for phase in phases:
            progress = _Progress()
            stop = threading.Event()
            mon = threading.Thread(target=_monitor, args=(backend.url, progress, args.poll, stop))
            mon.start()
            t0 = time.monotonic()
            try:
                _write_phase(store, backend, phase, args.turns, args.writers, progress)
                write_s = time.monotonic() - t0
                under_load = list(progress.samples)
                lags_under_load = list(progress.lags)
                deadline = time.monotonic() + DRAIN_LIMIT
                while progress.unsealed() and time.monotonic() < deadline:
                    time.sleep(args.poll)  # the monitor counts; this only paces the check
                drain_s = time.monotonic() - t0 - write_s
            finally:
                stop.set()
                mon.join()
            events += progress.events
            n_events = events
            es_bytes, bare_bytes = backend.sizes()
            first, last = "s00000", f"s{phase[-1]:05d}"
            point: dict[str, Any] = {
                "sessions": phase[-1] + 1,
                "events": n_events,
                "elapsed_s": time.monotonic() - started,
                "write_s": write_s,
                "drain_s": drain_s,
                "load_average": os.getloadavg(),
                "bytes": es_bytes,
                "bare_bytes": bare_bytes,
                "bytes_per_event": es_bytes / n_events,
                "bare_bytes_per_event": bare_bytes / n_events,
                "data_bytes_per_event": (es_bytes - empty_es) / n_events,
                "bare_data_bytes_per_event": (bare_bytes - empty_bare) / n_events,
                "append_turn_ms": statistics.median(progress.append_s) * 1000,
                "append_turn_p95_ms": _pct(progress.append_s, 0.95) * 1000,
                "bare_turn_ms": statistics.median(progress.bare_s) * 1000,
                "unsealed_median": statistics.median(n for _, n in under_load) if under_load else 0,
                "unsealed_max": max((n for _, n in under_load), default=0),
                "unsealed_samples": under_load,
                "lag_p50_s": _pct(lags_under_load, 0.5),
                "lag_p95_s": _pct(lags_under_load, 0.95),
                "lag_max_s": max(lags_under_load, default=float("nan")),
                "lag_all_p50_s": _pct(progress.lags, 0.5),
                "lag_all_max_s": max(progress.lags, default=float("nan")),
                "early": _reads(store, first, args.repeats),
                "late": _reads(store, last, args.repeats),
            }
            result["checkpoints"].append(point)
            print(_row(point), flush=True)
            _save(args, result)
    finally:
        store.close()


HEADER = (
    "| sessions | events | bytes/event (bare) | × bare | data × bare | append/turn ms (bare) | × bare "
    "| unsealed closed turns under load: median / max | close → seal s: p50 / p95 / max | drain s "
    "| head early / late ms | × decode | checkout early / late ms | × decode |"
)


def _row(p: dict[str, Any]) -> str:
    e, late = p["early"], p["late"]
    return (
        f"| {p['sessions']:,} | {p['events']:,} | {p['bytes_per_event']:.1f} ({p['bare_bytes_per_event']:.1f}) "
        f"| {p['bytes_per_event'] / p['bare_bytes_per_event']:.3f} "
        f"| {p['data_bytes_per_event'] / p['bare_data_bytes_per_event']:.3f} "
        f"| {p['append_turn_ms']:.1f} ({p['bare_turn_ms']:.1f}) | {p['append_turn_ms'] / p['bare_turn_ms']:.2f} "
        f"| {p['unsealed_median']:.0f} / {p['unsealed_max']} "
        f"| {p['lag_p50_s']:.2f} / {p['lag_p95_s']:.2f} / {p['lag_max_s']:.2f} | {p['drain_s']:.1f} "
        f"| {e['head_ms']:.2f} / {late['head_ms']:.2f} | {e['head_x_decode']:.1f} / {late['head_x_decode']:.1f} "
        f"| {e['checkout_ms']:.2f} / {late['checkout_ms']:.2f} "
        f"| {e['checkout_x_decode']:.1f} / {late['checkout_x_decode']:.1f} |"
    )


def _save(args: argparse.Namespace, result: dict[str, Any]) -> None:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


def _table(result: dict[str, Any]) -> str:
    """The markdown table of a run's checkpoints (also of a run stopped part-way)."""
    lines = [HEADER, "|" + "--:|" * (HEADER.count("|") - 1)]
    lines += [_row(p) for p in result["checkpoints"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the growth measurement; print and save its table."""
    p = argparse.ArgumentParser(prog="python -m benchmarks growth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--writers", type=int, default=2, help="writer threads (default 2)")
    p.add_argument("--checkpoints", type=int, default=10)
    p.add_argument("--backend", choices=("postgresql", "sqlite"), default="postgresql")
    p.add_argument("--repeats", type=int, default=15, help="calls per read figure (median)")
    p.add_argument("--poll", type=float, default=0.25, help="seconds between the monitor's looks")
    p.add_argument("--json", default=str(OUT))
    p.add_argument("--table", metavar="JSON", help="only print the table of a saved run")
    args = p.parse_args(argv)
    if args.table:
        print(_table(json.loads(Path(args.table).read_text())))
        return 0
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    result: dict[str, Any] = {
        "machine": machine(["psycopg", "sqlalchemy"], implementation=True),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": head,
        "args": vars(args),
    }
    print(HEADER)
    print("|" + "--:|" * (HEADER.count("|") - 1))
    _run(args, result)
    result["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    _save(args, result)
    return 0
