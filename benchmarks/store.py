"""Store benchmark: EventStore against raw drivers on a bare table, PostgreSQL and SQLite.

Run (PostgreSQL comes from scripts/with-postgres, fsync on, default durability)::

    scripts/with-postgres .venv/bin/python -m benchmarks store            # ~1 min
    scripts/with-postgres .venv/bin/python -m benchmarks store --quick    # ~30 s
    ... --no-record      # do not rewrite the "## Store" section of benchmarks/RESULTS.md

Every figure is a ratio against a baseline measured in the same run, on the same server:
raw psycopg (or raw sqlite3 in WAL mode) on a bare table
``(session_id text, seq int, type text, data jsonb|text, created_at, PK(session_id, seq))``.
Workload: ``eventstore.samples.chat_session(T)`` (≈ 86 events per turn), T = 10, 50, 200.
Fixed seeds. Appends: ours and the baseline write the same blocks alternately, each on its
own growing session, and the ratio is the median over blocks. Loads: the median of repeats
after a warm-up.

- append one event per transaction (target: ≥ 0.8× raw INSERT + COMMIT throughput);
- append one turn per transaction (target: ≥ 1.0× raw pipelined executemany + COMMIT);
- load head (targets: T=200 ÷ T=50 ≤ 1.5; ≤ 0.25× raw fetch-and-fold at T=50);
- load an old version (snapshot reads and events folded per load);
- bytes per event including snapshots and indexes (targets: ≤ 1.5× bare at T=200;
  T=200 ÷ T=10 ≤ 1.2);
- the same storage/load figures for several ``snapshot_every`` values, to choose the default.

The one-event append and the head load side by side with a git revision (the project as it
was, run in the same run): ``python -m benchmarks hotpath``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg.types.json import set_json_loads

from benchmarks._common import record_section, run_times, split_turns
from eventstore.core.reducer import fold_json
from eventstore.samples import chat_session
from eventstore import EventStore
from eventstore.engine.engine import DEFAULT_SNAPSHOT_EVERY, Engine

__all__ = ["main"]

SECTION = "## Store"
OUT = Path(__file__).parent / "out" / "store.json"
RESULTS = Path(__file__).parent / "RESULTS.md"
TURNS = (10, 50, 200)


# ----------------------------------------------------------------------------- helpers


def _median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    return statistics.median(run_times(fn, repeats, warmup))


def _paired(raw: Callable[[], Any], ours: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median times of two workloads run alternately, so both see the same machine state."""
    raw()
    ours()
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeats):
        for fn, out in ((raw, a), (ours, b)):
            gc.collect()
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


def _sid(tag: str) -> str:
    return f"bench-{tag}-{uuid.uuid4().hex[:8]}"


def _psycopg_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextmanager
def _pg_schema(admin_url: str) -> Iterator[str]:
    """A fresh schema; yields a SQLAlchemy URL whose search_path is it."""
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_psycopg_dsn(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in admin_url else "?"
    try:
        yield f"{admin_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(_psycopg_dsn(admin_url), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


# ----------------------------------------------------------------------------- raw baselines


class RawPostgres:
    """psycopg 3 on the bare table, written the way a careful person would."""

    DDL = (
        "CREATE TABLE bare (session_id text NOT NULL, seq int NOT NULL, type text NOT NULL, "
        "data jsonb NOT NULL, created_at timestamptz NOT NULL, PRIMARY KEY (session_id, seq))"
    )
    INSERT = "INSERT INTO bare VALUES (%s, %s, %s, %s::jsonb, %s)"

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(_psycopg_dsn(url))
        set_json_loads(orjson.loads, self.conn)
        self.conn.execute(self.DDL)
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()

    def append_each(self, sid: str, actions: list[dict[str, Any]], start: int = 0) -> None:
        for i, a in enumerate(actions, start + 1):
            now = dt.datetime.now(dt.timezone.utc)
            self.conn.execute(self.INSERT, (sid, i, a["type"], orjson.dumps(a).decode(), now))
            self.conn.commit()

    def append_turns(self, sid: str, turns: list[list[dict[str, Any]]], start: int = 0) -> None:
        seq = start
        with self.conn.cursor() as cur:
            for turn in turns:
                now = dt.datetime.now(dt.timezone.utc)
                rows = []
                for a in turn:
                    seq += 1
                    rows.append((sid, seq, a["type"], orjson.dumps(a).decode(), now))
                cur.executemany(self.INSERT, rows)  # pipeline mode inside psycopg >= 3.1
                self.conn.commit()

    def load(self, sid: str) -> dict[str, Any]:
        rows = self.conn.execute(
            "SELECT data FROM bare WHERE session_id = %s ORDER BY seq", (sid,)
        ).fetchall()
        self.conn.commit()
        return fold_json(None, (r[0] for r in rows))

    def size(self) -> int:
        self.conn.execute("VACUUM ANALYZE bare") if self.conn.autocommit else None
        (n,) = self.conn.execute("SELECT pg_total_relation_size('bare')").fetchone()  # type: ignore[misc]
        self.conn.commit()
        return int(n)


class RawSQLite:
    """sqlite3 in WAL mode on the bare table (JSON as text: SQLite 3.40 has no jsonb)."""

    DDL = (
        "CREATE TABLE bare (session_id text NOT NULL, seq int NOT NULL, type text NOT NULL, "
        "data text NOT NULL, created_at text NOT NULL, PRIMARY KEY (session_id, seq))"
    )
    INSERT = "INSERT INTO bare VALUES (?, ?, ?, ?, ?)"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(self.DDL)

    def close(self) -> None:
        self.conn.close()

    def append_each(self, sid: str, actions: list[dict[str, Any]], start: int = 0) -> None:
        for i, a in enumerate(actions, start + 1):
            now = dt.datetime.now(dt.timezone.utc).isoformat()
            self.conn.execute("BEGIN")
            self.conn.execute(self.INSERT, (sid, i, a["type"], orjson.dumps(a).decode(), now))
            self.conn.execute("COMMIT")

    def append_turns(self, sid: str, turns: list[list[dict[str, Any]]], start: int = 0) -> None:
        seq = start
        for turn in turns:
            now = dt.datetime.now(dt.timezone.utc).isoformat()
            rows = []
            for a in turn:
                seq += 1
                rows.append((sid, seq, a["type"], orjson.dumps(a).decode(), now))
            self.conn.execute("BEGIN")
            self.conn.executemany(self.INSERT, rows)
            self.conn.execute("COMMIT")

    def load(self, sid: str) -> dict[str, Any]:
        rows = self.conn.execute(
            "SELECT data FROM bare WHERE session_id = ? ORDER BY seq", (sid,)
        ).fetchall()
        return fold_json(None, (orjson.loads(r[0]) for r in rows))

    def size(self) -> int:
        return _sqlite_size(self.conn)


def _sqlite_size(conn: Any) -> int:
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    (free,) = conn.execute("PRAGMA freelist_count").fetchone()
    (size,) = conn.execute("PRAGMA page_size").fetchone()
    return int((pages - free) * size)


# ----------------------------------------------------------------------------- our side


_OUR_TABLES = ("sessions", "events", "snapshots", "snapshot_blobs", "compaction_permits")


def _our_size(store: EventStore, url: str) -> int:
    if store.backend == "postgresql":
        with psycopg.connect(_psycopg_dsn(url)) as conn:
            total = 0
            for t in _OUR_TABLES:
                (n,) = conn.execute("SELECT pg_total_relation_size(%s)", (t,)).fetchone()  # type: ignore[misc]
                total += int(n)
            return total
    path = url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # Our tables only: the file also holds Alembic's one-row version table (one page).
        return _sqlite_size(conn) - 4096
    finally:
        conn.close()


class Counting:
    """Counts snapshot reads and folded events of an engine's loads."""

    def __init__(self, engine: Engine) -> None:
        self.snapshots = 0
        self.events = 0
        st = engine.storage
        real_snap, real_read = st.snapshots, st.read_events
        real_parts = st.load_parts
        inside = [False]  # within load_parts: count from its result, not twice

        def snapshots(*a: Any, **k: Any) -> Any:
            s = real_snap(*a, **k)
            self.snapshots += bool(s) and k.get("usable_by") is not None and not inside[0]
            return s

        def read_events(*a: Any, **k: Any) -> Any:
            p = real_read(*a, **k)
            self.events += 0 if inside[0] or not k.get("payloads") else len(p)
            return p

        def load_parts(*a: Any, **k: Any) -> Any:
            # The one-statement load of a root session: one snapshot read (if any) and
            # the tail it folds, as the general path would count them.
            inside[0] = True
            try:
                parts = real_parts(*a, **k)
            finally:
                inside[0] = False
            if parts is not None and parts.complete:
                self.snapshots += parts.rest is not None
                self.events += parts.n_tail
            return parts

        st.snapshots = snapshots  # type: ignore[method-assign]
        st.read_events = read_events  # type: ignore[method-assign]
        st.load_parts = load_parts  # type: ignore[method-assign]


# ----------------------------------------------------------------------------- the run


def _backend_run(
    backend: str, url: str, raw: Any, args: argparse.Namespace, rng: random.Random
) -> dict[str, Any]:
    """All figures of one backend. ``url``: an empty database for EventStore."""
    res: dict[str, Any] = {"backend": backend}
    workload = {t: chat_session(t, seed=t) for t in TURNS}

    with EventStore(url) as store:
        store.migrate()

        # 1. one event per transaction, 2. one turn per transaction: alternating blocks
        # on one growing session per side (steady state, snapshots included).
        each = workload[200][: args.each_events]
        blocks = [each[i : i + args.block_events] for i in range(1, len(each), args.block_events)]
        res["append_event"] = _alternating(
            lambda sid, block, start: raw.append_each(sid, block, start),
            lambda sid, block, start: _append_each(store, sid, block),
            each[0],
            blocks,
            "events",
        )
        turns = split_turns(workload[200])[: args.turns]
        tblocks = [turns[i : i + args.block_turns] for i in range(1, len(turns), args.block_turns)]
        res["append_turn"] = _alternating(
            lambda sid, block, start: raw.append_turns(sid, block, start),
            lambda sid, block, start: _append_turns(store, sid, block),
            turns[0],
            tblocks,
            "turns",
        )

    # 3-5. per session length: load head, old versions, storage — and the snapshot sweep
    sweep: dict[int, dict[str, Any]] = {}
    for every in sorted(set(args.snapshot_every) | {DEFAULT_SNAPSHOT_EVERY}):
        sweep[every] = _session_figures(backend, url, raw, workload, every, args, rng)
    res["by_snapshot_every"] = {str(k): v for k, v in sweep.items()}
    res["default"] = sweep[DEFAULT_SNAPSHOT_EVERY]
    return res


def _alternating(
    raw: Callable[[str, list[Any], int], Any],
    ours: Callable[[str, list[Any], int], Any],
    first: Any,
    blocks: list[list[Any]],
    unit: str,
) -> dict[str, Any]:
    """Raw and ours write the same blocks, alternately (which one goes first alternates too),
    each continuing its own session. Ratio = raw ÷ ours time per block, median over blocks:
    each pair ran moments apart, so it shares the machine's state; a noisy moment spoils one
    pair, not the figure."""
    sr, so = _sid("r"), _sid("o")
    single = unit == "events"
    raw(sr, [first], 0)  # creates the session: the timed blocks are appends to it
    ours(so, [first], 0)
    pos = 1 if single else len(first)
    t_raw: list[float] = []
    t_our: list[float] = []
    for i, block in enumerate(blocks):
        gc.collect()
        pair = ((raw, sr, t_raw), (ours, so, t_our))
        for fn, sid, out in pair if i % 2 == 0 else pair[::-1]:
            t0 = time.perf_counter()
            fn(sid, block, pos)
            out.append(time.perf_counter() - t0)
        pos += len(block) if single else sum(len(t) for t in block)
    n_units = sum(len(b) for b in blocks)
    n_events = n_units if single else sum(len(t) for b in blocks for t in b)
    per = 1e6 if single else 1e3
    ratios = [r / o for r, o in zip(t_raw, t_our)]
    return {
        unit: n_units,
        "events": n_events,
        "blocks": len(blocks),
        "raw_s": sum(t_raw),
        "ours_s": sum(t_our),
        ("raw_us_per_event" if single else "raw_ms_per_turn"): sum(t_raw) / n_units * per,
        ("ours_us_per_event" if single else "ours_ms_per_turn"): sum(t_our) / n_units * per,
        "throughput_ratio": statistics.median(ratios),
        "ratio_quartiles": statistics.quantiles(ratios, n=4),
    }


def _append_each(store: EventStore, sid: str, actions: list[dict[str, Any]]) -> None:
    for a in actions:
        store.append(sid, [a])


def _append_turns(store: EventStore, sid: str, turns: list[list[dict[str, Any]]]) -> None:
    for turn in turns:
        store.append(sid, turn)


def _session_figures(
    backend: str,
    admin_or_dir: str,
    raw_unused: Any,
    workload: dict[int, list[dict[str, Any]]],
    every: int,
    args: argparse.Namespace,
    rng: random.Random,
) -> dict[str, Any]:
    out: dict[str, Any] = {"snapshot_every": every, "by_turns": {}}
    for t in TURNS:
        actions = workload[t]
        turns = split_turns(actions)
        with _fresh(backend, args) as (url, raw):
            sid = f"bench-session-{t:04d}"
            raw.append_turns(sid, turns)
            raw_size = raw.size()
            with EventStore(url, snapshot_every=every) as store:
                store.migrate()
                _append_turns(store, sid, turns)
                ours_size = _our_size(store, url)
            with EventStore(url, snapshot_every=every) as store:
                head = len(actions)
                assert store.load(sid).to_json() == fold_json(None, actions)
                t_raw, t_head = _paired(
                    lambda: raw.load(sid), lambda: store.load(sid), args.load_repeats
                )
                state = fold_json(None, actions)
                blob = orjson.dumps(state)
                t_decode = _median_time(lambda: orjson.loads(blob), args.load_repeats, warmup=1)
            # Old versions through the engine under the store, whose storage calls can be counted.
            engine = Engine(url, snapshot_every=every)
            try:
                counter = Counting(engine)
                versions = [rng.randint(1, head) for _ in range(args.old_versions)]
                t0 = time.perf_counter()
                worst = 0
                for v in versions:
                    before = counter.events
                    engine.load(sid, v)
                    worst = max(worst, counter.events - before)
                t_old = (time.perf_counter() - t0) / len(versions)
            finally:
                engine.close()
            out["by_turns"][str(t)] = {
                "events": head,
                "state_bytes": len(blob),
                "raw_bytes": raw_size,
                "ours_bytes": ours_size,
                "raw_bytes_per_event": raw_size / head,
                "ours_bytes_per_event": ours_size / head,
                "size_ratio": ours_size / raw_size,
                "load_head_ms": t_head * 1e3,
                "raw_fetch_fold_ms": t_raw * 1e3,
                "load_vs_raw": t_head / t_raw,
                "state_decode_ms": t_decode * 1e3,
                "decode_share": t_decode / t_head,
                "old_version_load_ms": t_old * 1e3,
                "old_snapshot_reads_per_load": counter.snapshots / len(versions),
                "old_events_folded_mean": counter.events / len(versions),
                "old_events_folded_max": worst,
            }
    bt = out["by_turns"]
    out["load_growth_200_50"] = bt["200"]["load_head_ms"] / bt["50"]["load_head_ms"]
    out["bytes_growth_200_10"] = (
        bt["200"]["ours_bytes_per_event"] / bt["10"]["ours_bytes_per_event"]
    )
    return out


@contextmanager
def _fresh(backend: str, args: argparse.Namespace) -> Iterator[tuple[str, Any]]:
    """An empty database for us and one for the raw baseline."""
    if backend == "postgresql":
        with _pg_schema(args.pg_url) as ours, _pg_schema(args.pg_url) as bare:
            raw = RawPostgres(bare)
            try:
                yield ours, raw
            finally:
                raw.close()
    else:
        with tempfile.TemporaryDirectory(prefix="es-bench-") as d:
            raw = RawSQLite(Path(d) / "bare.db")
            try:
                yield f"sqlite:///{Path(d) / 'ours.db'}", raw
            finally:
                raw.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.fold import machine

    rng = random.Random(args.seed)
    results: dict[str, Any] = {
        "benchmark": "store",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "default_snapshot_every": DEFAULT_SNAPSHOT_EVERY,
        "backends": {},
    }
    for backend in args.backends:
        with _fresh(backend, args) as (url, raw):
            if backend == "postgresql":
                with psycopg.connect(_psycopg_dsn(args.pg_url)) as c:
                    results["postgres_version"] = c.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
                    results["postgres_fsync"] = c.execute("SHOW fsync").fetchone()[0]  # type: ignore[index]
                    results["postgres_sync_commit"] = c.execute(
                        "SHOW synchronous_commit"
                    ).fetchone()[0]  # type: ignore[index]
            else:
                results["sqlite_version"] = sqlite3.sqlite_version
            results["backends"][backend] = _backend_run(backend, url, raw, args, rng)
    return results


# ----------------------------------------------------------------------------- report


def _targets(r: dict[str, Any]) -> list[tuple[str, str, bool]]:
    d = r["default"]["by_turns"]
    return [
        (
            "append 1 event/txn ≥ 0.8× raw",
            f"{r['append_event']['throughput_ratio']:.2f}×",
            r["append_event"]["throughput_ratio"] >= 0.8,
        ),
        (
            "append 1 turn/txn ≥ 1.0× raw executemany",
            f"{r['append_turn']['throughput_ratio']:.2f}×",
            r["append_turn"]["throughput_ratio"] >= 1.0,
        ),
        (
            "load head T=200 ÷ T=50 ≤ 1.5",
            f"{r['default']['load_growth_200_50']:.2f}",
            r["default"]["load_growth_200_50"] <= 1.5,
        ),
        (
            "load head ≤ 0.25× raw fetch+fold (T=50)",
            f"{d['50']['load_vs_raw']:.3f}×",
            d["50"]["load_vs_raw"] <= 0.25,
        ),
        (
            "bytes/event ≤ 1.5× bare (T=200)",
            f"{d['200']['size_ratio']:.2f}×",
            d["200"]["size_ratio"] <= 1.5,
        ),
        (
            "bytes/event T=200 ÷ T=10 ≤ 1.2",
            f"{r['default']['bytes_growth_200_10']:.2f}",
            r["default"]["bytes_growth_200_10"] <= 1.2,
        ),
        (
            f"old version: ≤ 1 snapshot + < {r['default']['snapshot_every']} events",
            f"{d['200']['old_snapshot_reads_per_load']:.2f} snapshot, ≤ {d['200']['old_events_folded_max']} events",
            d["200"]["old_snapshot_reads_per_load"] <= 1
            and d["200"]["old_events_folded_max"] < r["default"]["snapshot_every"],
        ),
    ]


def render(res: dict[str, Any], command: str) -> str:
    m = res["machine"]
    lines = [
        SECTION,
        "",
        f"Command: `{command}` — {res['date']}",
        "",
        f"Machine: `{m['uname']}`, nproc {m['nproc']}, Python {m['python']}; "
        f"PostgreSQL {res.get('postgres_version', '-')} (fsync={res.get('postgres_fsync', '-')}, "
        f"synchronous_commit={res.get('postgres_sync_commit', '-')}), SQLite {res.get('sqlite_version', '-')} "
        f"(WAL, synchronous=FULL on both sides); packages {json.dumps(m['packages'])}.",
        "",
        "Workload `chat_session(T, seed=T)` (≈ 86 events/turn). Baselines in the same run: raw psycopg "
        "(`INSERT … %s::jsonb` + COMMIT; `executemany` in pipeline mode + COMMIT; `SELECT data … ORDER BY seq` "
        "decoded with orjson and folded with `fold_json`) on `bare(session_id text, seq int, type text, data jsonb, "
        "created_at timestamptz, PK(session_id, seq))`, and raw sqlite3 (WAL) on the same shape with JSON text. "
        "Appends: ours and the baseline write the same blocks alternately (who goes first alternates too), "
        "each continuing its own session, and a ratio is the median over blocks of raw time ÷ our time, so "
        "each pair shares the machine's state (this machine is shared and noisy). Loads: medians of "
        "repeats after a warm-up, ours and the baseline alternating. "
        f"Default `snapshot_every` = {res['default_snapshot_every']}.",
        "",
    ]
    for backend, r in res["backends"].items():
        d = r["default"]["by_turns"]
        lines += [
            f"### {backend}",
            "",
            "| target | measured | met |",
            "|---|---:|:---:|",
        ]
        lines += [
            f"| {name} | {val} | {'yes' if ok else '**no**'} |" for name, val, ok in _targets(r)
        ]
        ae, at = r["append_event"], r["append_turn"]
        lines += [
            "",
            f"Append, on a growing session (T=200 workload), {ae['blocks']} alternating blocks each: "
            f"one event/txn {ae['ours_us_per_event']:.0f} µs vs raw {ae['raw_us_per_event']:.0f} µs "
            f"({ae['events']} events; per-block ratio quartiles "
            f"{ae['ratio_quartiles'][0]:.2f} / {ae['ratio_quartiles'][1]:.2f} / {ae['ratio_quartiles'][2]:.2f}); "
            f"one turn/txn {at['ours_ms_per_turn']:.2f} ms vs raw {at['raw_ms_per_turn']:.2f} ms "
            f"({at['turns']} turns, {at['events']} events; quartiles "
            f"{at['ratio_quartiles'][0]:.2f} / {at['ratio_quartiles'][1]:.2f} / {at['ratio_quartiles'][2]:.2f}).",
            "",
            "| T | events | state KB | bytes/event ours | bare | ratio | load head ms | raw fetch+fold ms | ÷ raw "
            "| decode share | old version ms | events folded (mean / max) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for t, f in d.items():
            lines.append(
                f"| {t} | {f['events']:,} | {f['state_bytes'] / 1024:.0f} | {f['ours_bytes_per_event']:.0f} | {f['raw_bytes_per_event']:.0f} "
                f"| {f['size_ratio']:.2f} | {f['load_head_ms']:.2f} | {f['raw_fetch_fold_ms']:.2f} "
                f"| {f['load_vs_raw']:.3f} | {f['decode_share']:.0%} | {f['old_version_load_ms']:.2f} "
                f"| {f['old_events_folded_mean']:.0f} / {f['old_events_folded_max']} |"
            )
        lines += [
            "",
            "`snapshot_every` sweep (T=200):",
            "",
            "| snapshot_every | bytes/event ÷ bare | bytes/event 200÷10 | load head ms | old version ms | events folded max |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for k, s in r["by_snapshot_every"].items():
            f = s["by_turns"]["200"]
            lines.append(
                f"| {k} | {f['size_ratio']:.2f} | {s['bytes_growth_200_10']:.2f} | {f['load_head_ms']:.2f} "
                f"| {f['old_version_load_ms']:.2f} | {f['old_events_folded_max']} |"
            )
        lines.append("")
    lines += [
        "Notes (read with the tables above):",
        "",
        "- *Bytes per event* count everything of ours — events with their 32-byte hash, the primary key and "
        "event-id indexes, sessions, snapshots and the shared message blobs (PostgreSQL: "
        "`pg_total_relation_size` of each table incl. TOAST and indexes; SQLite: used pages of the file "
        "after a checkpoint) — against the bare table with its primary key. Snapshots share structure "
        "(one blob per distinct chunk of 16 consecutive top-level messages, chunk digests per snapshot), "
        "so the figure stays flat in T.",
        "- *Load head* cannot be flat in T: the head state itself grows with the session (the `state KB` "
        "column — every message of every turn), and a load must read and decode all of it. What is flat is "
        "the event part: at most `snapshot_every − 1` events are folded whatever T is. The rest of the time "
        "is fetching the message blobs (≈ 38 chunk rows at T=200) and parsing them (`decode share` = "
        "`orjson.loads` of the state's JSON alone, as a share of the load).",
        "- *Append* targets: our append validates every action with pydantic (one pydantic-core call per "
        "batch, ≈ 3 µs/action), encodes it canonically, hashes the chain (≈ 2.5 µs/event) and, every "
        "`snapshot_every` events, folds the pending actions into the cached head state and writes a "
        "snapshot; the raw baseline does none of that. Measured with the database call stubbed out, this "
        "is ≈ 44 µs per one-event append and ≈ 0.9 ms per 86-event turn (≈ 10 µs/event) of Python. On "
        "PostgreSQL an append is one round trip: the head check, the insert (scalar parameters for one "
        "event; arrays for a batch) and any due snapshot in one autocommit statement on "
        "an autocommit psycopg connection kept for these statements outside the SQLAlchemy pool, not "
        "pinged (an alive-bypass window: it pings only one idle > 0.5 s, one whose socket shows the server "
        "closed it, or after a connection failure; every other checkout keeps the pre-ping). On SQLite it is BEGIN IMMEDIATE, the checked "
        "head move, one executemany, COMMIT on the pooled sqlite3 connection. Where the raw write is cheap "
        "(a fast fsync, SQLite), this fixed CPU cost decides the ratio; where the fsync is slow, the ratios "
        "rise toward 1. The session head row written in the same commit is not where the time goes: at the "
        "SQL level (separate probe, same machine, medians of 40 alternating rounds of 50 single-event "
        "commits) the append with its head UPDATE costs 1.11× (PostgreSQL) / 1.16× (SQLite) the same "
        "INSERT without it, and that INSERT alone is as fast as the raw bare-table INSERT + COMMIT; the "
        "rest of the gap is client CPU (validation, hashing, fold, pool checkout, and on PostgreSQL "
        "psycopg's adaptation of the batch's array parameters), which no schema change removes. On "
        "SQLite a raw turn costs ≈ 7 µs/event in all, less than our Python alone: the per-turn target "
        "cannot be met by a layer that validates and hashes each event in Python.",
        "- The machine is shared (2 cores; other suites ran during these runs, load average 4–11), so "
        "single figures move by ±30% between runs; the ratios are taken from alternating blocks of ours "
        "and the baseline to keep them comparable, and the quartiles show their spread. The "
        "`snapshot_every` sweep's load times are too noisy to rank; its storage figures are exact.",
        f"- *Default `snapshot_every` = {res['default_snapshot_every']}*: with every event a row "
        "(the sweep of 2026-11-30, before sealing) 128 and 256 are within 3% of each other in storage and the sweep shows no "
        "load-time difference above its noise; once closed turns are sealed (the default), the snapshots "
        "are about half of what a session stores (each re-stores the chunk of its newest messages), and "
        "256 halves them (\"Sealed segments\" below) while a load still folds fewer than 256 events.",
        "",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks store", description=__doc__.splitlines()[0]
    )
    p.add_argument("--quick", action="store_true", help="fewer repeats and a smaller sweep")
    p.add_argument("--backends", default="postgresql,sqlite")
    p.add_argument("--pg-url", default=os.environ.get("EVENTSTORE_TEST_PG_URL"))
    p.add_argument("--snapshot-every", default="32,64,128,256")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-record", action="store_true", help="do not rewrite benchmarks/RESULTS.md")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(list(argv or []))
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.snapshot_every = [int(x) for x in args.snapshot_every.split(",") if x]
    if "postgresql" in args.backends and not args.pg_url:
        p.error(
            "PostgreSQL needs --pg-url or EVENTSTORE_TEST_PG_URL (run under scripts/with-postgres)"
        )
    args.load_repeats = 5 if args.quick else 11
    args.each_events = 301 if args.quick else 1501
    args.block_events = 30 if args.quick else 50
    args.turns = 21 if args.quick else 91
    args.block_turns = 2 if args.quick else 3
    args.old_versions = 20 if args.quick else 60
    if args.quick:
        args.snapshot_every = [DEFAULT_SNAPSHOT_EVERY]
    res = run(args)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(res, indent=2))
    command = "scripts/with-postgres .venv/bin/python -m benchmarks store" + (
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
