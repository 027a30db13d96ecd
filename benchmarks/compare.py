"""eventstore versus the peers a user would pick instead, on one workload, in one run.

Run under a throwaway PostgreSQL (fsync on)::

    scripts/with-postgres .venv/bin/python -m benchmarks compare            # ~10 min
    scripts/with-postgres .venv/bin/python -m benchmarks compare --quick    # ~2 min

Targets (``benchmarks/peers/``): raw psycopg on a bare table (the limit every ratio is
against), eventstore on PostgreSQL and SQLite, LangGraph ``PostgresSaver`` with a
checkpoint per event and per turn, LangGraph ``DeltaChannel``, ``eventsourcing`` without
and with snapshots. Workload: ``eventstore.samples.chat_session(T, seed)`` (~86 events per
turn) for T = 10, 50, 200.

For every target and T, in a database (or SQLite file) of its own:

1. write the session one turn per durable write (timed: *per-turn append*), alternating
   with equal blocks of raw psycopg turn writes (:class:`RawBlocks`: the ratio sees the
   same machine noise), remembering the head at turn T/2 (the *old version*);
2. measure bytes on disk (tables + indexes + TOAST after ``VACUUM FULL``, once the target
   has finished its background work: eventstore's sealer), then write a second session of
   the same length (untimed) and measure again: what one more session costs per event,
   without the fixed cost of the schema and of every table's first pages;
3. load the head and the old version and compare them with the reference fold
   (``eventstore.core.reducer.fold``) — a mismatch marks the target WRONG;
4. time load head, load old version (median of ``--repeats`` after one warm-up) and reading
   the full history (bounded by ``--history-limit`` seconds);
5. append the next turns one event per durable write, alternating with equal blocks of
   raw psycopg single-event writes (timed: *per-event append* at session length T),
   measure the bytes they added, then check the head again.

Then the concurrency cells: W = 1, 4, 16 writer processes, each on its own session, each
appending one event per durable write for ``--cell-seconds``; throughput and p50/p99
latency. Results go to JSON (``--json``), the "## Versus peers" section of
``benchmarks/RESULTS.md`` (``--results``) and PNG plots in ``benchmarks/figures/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import multiprocessing as mp
import os
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

from benchmarks._common import run_times, split_turns
from benchmarks.peers import KEYS, Unsupported, make_target, unavailable
from benchmarks.peers.base import Action, drop_database, pg_url
from eventstore.core.reducer import fold
from eventstore.samples import chat_session

HERE = Path(__file__).resolve().parent
SEED = 20251129
SESSION = "chat-1"
SECOND = "chat-2"  # the second session of the same length: its bytes are the marginal cost
EXTRA_TURNS = 5  # turns appended one event per write after the per-turn session


# --------------------------------------------------------------------------- workload


def reference(actions: Sequence[Action]) -> dict[str, Any]:
    """The reference state: the validating fold of the actions, as wire-shaped JSON."""
    return fold(list(actions)).to_json()


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    return statistics.median(run_times(fn, repeats, warmup=1)) * 1000


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]


CPU = [0.0]
"""Client CPU seconds (this process) spent inside timed appends, accumulated."""


def _timed_append(target: Any, session: str, actions: Sequence[Action]) -> float:
    """One durable write; a target's untimed ``prepare`` (state folding) is left out."""
    prepare = getattr(target, "prepare", None)
    if prepare is not None:
        token = prepare(session, actions)
        c0, t0 = time.process_time(), time.perf_counter()
        target.append_prepared(session, token)
    else:
        c0, t0 = time.process_time(), time.perf_counter()
        target.append(session, actions)
    wall = time.perf_counter() - t0
    CPU[0] += time.process_time() - c0
    return wall


def _settled_size(target: Any) -> int:
    """Bytes on disk once the target's background work is done, without free space.

    A sealing eventstore deletes a closed turn's rows as it writes their segment; a busy
    table's autovacuum makes that space reusable, but not within this benchmark's seconds.
    So every PostgreSQL target's database is rewritten (``VACUUM FULL``) before it is
    measured: the figure is the live data, for every target alike.
    """
    settle = getattr(target, "settle", None)
    if settle is not None:
        settle()
    db = getattr(target, "db", "")
    if db:
        with psycopg.connect(pg_url(db), autocommit=True) as conn:
            conn.execute("VACUUM FULL")
    return int(target.size_bytes())


def _drop(target: Any) -> None:
    db = getattr(target, "db", "")
    if db:
        drop_database(db)
    path = getattr(target, "path", "")
    for suffix in ("", "-wal", "-shm"):
        if path and os.path.exists(path + suffix):
            os.remove(path + suffix)


# --------------------------------------------------------------------------- one size


def run_size(target: Any, turns_n: int, opts: argparse.Namespace,
             ref: Any = None) -> dict[str, Any]:
    """Every single-writer figure of one target at session length ``turns_n``.

    ``ref`` is an open raw psycopg target: during the per-event phase each turn is also
    appended to it, right before the target's, so the per-event ratio pairs measurements
    taken seconds apart (the shared machine's noise moves both alike).
    """
    actions = chat_session(turns_n + EXTRA_TURNS, SEED)
    turns = split_turns(actions)
    main, extra = turns[:turns_n], turns[turns_n:]
    n = sum(len(t) for t in main)
    half = turns_n // 2
    v_old = sum(len(t) for t in main[:half])
    ref_head = reference(actions[:n])
    ref_old = reference(actions[:v_old])
    out: dict[str, Any] = {"turns": turns_n, "events": n, "old_version": v_old, "problems": []}

    target.open(f"t{turns_n}")
    try:
        out["empty_bytes"] = _settled_size(target)  # the schema alone
        # 1. the session, one turn per durable write, alternating with blocks of raw psycopg
        #    turn writes of the same duration (see RawBlocks)
        raw_turns = RawBlocks(ref, f"ref-turn-{target.key}-t{turns_n}", main, opts.block)
        # The heap is collected first (as _common.run_times does): a full collection, 40-80 ms
        # in this process, is otherwise due at a point set by the earlier targets' garbage and
        # lands in one target's timed appends (the first eventstore target's first turn).
        gc.collect()
        spent = 0.0
        for i, turn in enumerate(main, start=1):
            spent += _timed_append(target, SESSION, turn)
            raw_turns.after(spent)
            if i == half:
                target.mark(SESSION, v_old)
        raw_turns.finish(spent)
        target.mark(SESSION, n)
        out["write_s"] = spent
        out["per_turn_eps"] = n / spent if target.per_turn else None
        if raw_turns.events and target.per_turn:
            out["per_turn_raw_eps"] = raw_turns.eps()
            out["per_turn_ratio"] = out["per_turn_eps"] / raw_turns.eps()

        # 2. storage: the whole database, then what a second session of the same length
        #    adds to it (untimed), which leaves out every fixed cost of the database
        out["bytes"] = _settled_size(target)
        out["bytes_per_event"] = out["bytes"] / n
        second = split_turns(chat_session(turns_n, SEED + 1))
        for turn in second:
            target.append(SECOND, turn)
        n2 = sum(len(t) for t in second)
        out["bytes_two_sessions"] = _settled_size(target)
        out["marginal_bytes_per_event"] = (out["bytes_two_sessions"] - out["bytes"]) / n2

        # 3. correctness
        for label, version, expected in (("head", None, ref_head), ("old", v_old, ref_old)):
            try:
                got = target.load(SESSION, version=version)
            except Unsupported as exc:
                out["problems"].append(f"load {label}: unsupported ({exc})")
                continue
            if got != expected:
                out["problems"].append(f"load {label} (version {version or n}) != reference fold")

        # 4. reads
        out["load_head_ms"] = _median_ms(lambda: target.load(SESSION), opts.repeats)
        try:
            out["load_old_ms"] = _median_ms(lambda: target.load(SESSION, version=v_old), opts.repeats)
        except Unsupported:
            out["load_old_ms"] = None
        out.update(_history(target, opts))

        # 5. per-event appends at length T, alternating with blocks of raw psycopg
        #    single-event writes of the same duration
        extra_actions = [a for turn in extra for a in turn]
        raw_events = RawBlocks(ref, f"ref-event-{target.key}-t{turns_n}",
                               [[a] for a in extra_actions], opts.block)
        lats: list[float] = []
        gc.collect()  # as before the per-turn phase
        spent = 0.0
        version = n
        cpu = 0.0
        for a in extra_actions:
            c0 = CPU[0]
            d = _timed_append(target, SESSION, [a])
            cpu += CPU[0] - c0
            spent += d
            lats.append(d)
            version += 1
            raw_events.after(spent)
            if spent > opts.event_budget and version - n >= 20:
                break
        raw_events.finish(spent)
        target.mark(SESSION, version)
        # Bytes each event costs when it is written on its own (no batching to compress).
        # Not for a sealing store: the per-event appends close the turn the per-turn phase
        # left open, and its sealing (rows out, a segment in) is most of the difference.
        single = target.per_event and not getattr(target, "seal", False)
        out["bytes_per_event_single"] = (
            (_settled_size(target) - out["bytes_two_sessions"]) / (version - n) if single else None
        )
        out["per_event_eps"] = (version - n) / spent if target.per_event else None
        out["per_event_n"] = version - n
        out["per_event_cpu_ms"] = cpu / (version - n) * 1000
        out["per_event_p50_ms"] = _pct(lats, 0.5) * 1000
        out["per_event_p99_ms"] = _pct(lats, 0.99) * 1000
        if raw_events.events and target.per_event:
            out["per_event_raw_eps"] = raw_events.eps()
            out["per_event_ratio"] = out["per_event_eps"] / raw_events.eps()
        if target.load(SESSION) != reference(actions[:version]):
            out["problems"].append(f"load head after per-event appends (version {version}) != reference")
    finally:
        target.close()
        if not opts.keep:
            _drop(target)
    out["ok"] = not out["problems"]
    return out


class RawBlocks:
    """Raw psycopg writes run in blocks alternating with a target's writes.

    The shared machine's speed drifts by several times within a minute, so an append
    ratio is only meaningful between measurements taken in the same window. Interleaving
    item by item is biased too (the raw backend goes cold while the target works). So: each
    time the target has spent another ``block`` seconds writing, raw psycopg writes for
    ``block`` seconds (the same batches, cycled, to a session of its own). The ratio is
    target events/s over raw events/s across all blocks.
    """

    def __init__(self, ref: Any, session: str, batches: Sequence[Sequence[Action]], block: float):
        self.ref, self.session, self.batches, self.block = ref, session, batches, block
        self.next_at = block
        self.seconds = 0.0
        self.events = 0
        self.i = 0

    def after(self, target_spent: float) -> None:
        """Call after each target write with the target's total time so far."""
        if self.ref is None or target_spent < self.next_at:
            return
        self.next_at = target_spent + self.block
        stop = self.seconds + self.block
        while self.seconds < stop:
            batch = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.seconds += _timed_append(self.ref, self.session, batch)
            self.events += len(batch)

    def finish(self, target_spent: float) -> None:
        """A last raw block for the target time since the previous block (at least one)."""
        if self.ref is None:
            return
        rest = target_spent - (self.next_at - self.block)
        if rest > 0.2 * self.block or not self.events:
            self.next_at = target_spent
            stop = self.seconds + max(rest, 0.05)
            while self.seconds < stop:
                batch = self.batches[self.i % len(self.batches)]
                self.i += 1
                self.seconds += _timed_append(self.ref, self.session, batch)
                self.events += len(batch)

    def eps(self) -> float:
        return self.events / self.seconds if self.seconds else float("nan")


def _history(target: Any, opts: argparse.Namespace) -> dict[str, Any]:
    """Read the whole history; stop (and say so) after ``--history-limit`` seconds."""

    def once() -> tuple[float, int, bool]:
        t0 = time.perf_counter()
        count = 0
        for _ in target.history(SESSION):
            count += 1
            if time.perf_counter() - t0 > opts.history_limit:
                return time.perf_counter() - t0, count, False
        return time.perf_counter() - t0, count, True

    first = once()
    if not first[2] or first[0] > 5:
        return {"history_ms": first[0] * 1000, "history_items": first[1], "history_complete": first[2]}
    samples = [once()[0] for _ in range(max(1, opts.repeats // 2))]
    return {
        "history_ms": statistics.median(samples) * 1000,
        "history_items": first[1],
        "history_complete": True,
    }


def warm_up(target: Any) -> None:
    """Import paths, prepared statements, first connection: paid once, outside the figures."""
    actions = chat_session(2, SEED + 1)
    turns = split_turns(actions)
    target.open("warm")
    try:
        target.append("warm", turns[0])
        for a in turns[1][:20]:
            target.append("warm", [a])
        target.mark("warm", len(turns[0]) + 20)
        target.load("warm")
        for _ in target.history("warm"):
            pass
    finally:
        target.close()
        _drop(target)


# --------------------------------------------------------------------------- concurrency


def _writer(key: str, options: dict[str, Any], tag: str, w: int, seconds: float,
            barrier: Any, queue: Any) -> None:
    try:
        target = make_target(key, options)
        target.open(tag, create=False)
        actions = chat_session(60, SEED + 100 + w)
        session = f"writer-{w}"
        lats: list[float] = []
        errors = 0
        barrier.wait(timeout=120)
        t_end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < t_end and i < len(actions):
            t0 = time.perf_counter()
            try:
                target.append(session, [actions[i]])
            except Exception:  # noqa: BLE001 - counted and reported, the cell goes on
                errors += 1
                time.sleep(0.001)
                continue
            lats.append(time.perf_counter() - t0)
            i += 1
        target.close()
        queue.put({"w": w, "lats": lats, "errors": errors, "error": None})
    except Exception as exc:  # noqa: BLE001
        queue.put({"w": w, "lats": [], "errors": 1, "error": f"{type(exc).__name__}: {exc}"})


def run_concurrency(key: str, options: dict[str, Any], writers: int, seconds: float) -> dict[str, Any]:
    target = make_target(key, options)
    tag = f"c{writers}"
    target.open(tag)  # create the storage once; writers attach to it
    target.close()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(writers + 1)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(key, options, tag, w, seconds, barrier, queue))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=180)
        t0 = time.perf_counter()
    except Exception:  # noqa: BLE001 - a writer failed before the start line
        t0 = time.perf_counter()
    results = [queue.get(timeout=seconds + 300) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(timeout=60)
    _drop(target)
    lats = [x for r in results for x in r["lats"]]
    errs = [r["error"] for r in results if r["error"]]
    return {
        "writers": writers,
        "events": len(lats),
        "seconds": wall,
        "eps": len(lats) / max(wall, 1e-9),
        "p50_ms": _pct(lats, 0.50) * 1000,
        "p99_ms": _pct(lats, 0.99) * 1000,
        "failed_appends": sum(r["errors"] for r in results),
        "errors": errs[:3],
    }


# --------------------------------------------------------------------------- environment


def supplement(data: dict[str, Any], extra: dict[str, Any], source: str) -> None:
    """Fill sizes the main run skipped from another run; ratios use that run's raw psycopg."""
    raw = extra["targets"].get("raw", {}).get("sizes", {})
    for key, e in extra["targets"].items():
        main = data["targets"].get(key)
        if key == "raw" or main is None:
            continue
        for t, res in e.get("sizes", {}).items():
            cur = main.get("sizes", {}).get(t)
            if (cur is None or "skipped" in cur) and "error" not in res and "skipped" not in res:
                res = dict(res, supplement=extra.get("command", source), supplement_raw=raw.get(t, {}))
                main.setdefault("sizes", {})[t] = res


def environment() -> dict[str, Any]:
    def run(cmd: str) -> str:
        try:
            return subprocess.run(
                cmd, shell=True, capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except Exception:  # noqa: BLE001
            return "?"

    versions = {}
    for dist in ("eventstore", "psycopg", "SQLAlchemy", "pydantic", "orjson", "langgraph",
                 "langgraph-checkpoint", "langgraph-checkpoint-postgres", "eventsourcing",
                 "matplotlib"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    pg_version = "?"
    try:
        import psycopg

        from benchmarks.peers.base import pg_base_url

        with psycopg.connect(pg_base_url()) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            pg_version = row[0] if row else "?"
            fsync = conn.execute("SHOW fsync").fetchone()
            sync_commit = conn.execute("SHOW synchronous_commit").fetchone()
            pg_version += (
                f" (fsync={fsync[0] if fsync else '?'}, "
                f"synchronous_commit={sync_commit[0] if sync_commit else '?'})"
            )
    except Exception as exc:  # noqa: BLE001 - the report says why it is missing
        pg_version = f"? ({type(exc).__name__})"
    import sqlite3

    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "uname": run("uname -a"),
        "nproc": run("nproc"),
        "free": run("free -h"),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "postgresql": pg_version,
        "versions": versions,
        "commit": run("git -C " + str(HERE.parent) + " rev-parse --short HEAD")
        + (" + uncommitted changes in eventstore/"
           if run("git -C " + str(HERE.parent) + " status --porcelain -- eventstore") else ""),
    }


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="T=10,50; 3 repeats; 2 s cells; W=1,4")
    p.add_argument("--turns", default="10,50,200", help="session lengths in turns")
    p.add_argument("--targets", default=",".join(KEYS), help="comma-separated target keys")
    p.add_argument("--skip", default="", help="targets to leave out")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per read (median)")
    p.add_argument("--writers", default="1,4,16", help="concurrency cells (writer processes)")
    p.add_argument("--cell-seconds", type=float, default=3.0, help="duration of one concurrency cell")
    p.add_argument("--no-concurrency", action="store_true")
    p.add_argument("--history-limit", type=float, default=30.0, help="cap on one full-history read, s")
    p.add_argument("--event-budget", type=float, default=4.0,
                   help="cap on the target's time in the per-event append phase, s")
    p.add_argument("--block", type=float, default=0.25,
                   help="seconds per alternating block of target / raw psycopg appends")
    p.add_argument("--lg-event-max-turns", type=int, default=50,
                   help="LangGraph checkpoint-per-event writes O(T^2) bytes; longer sessions are skipped")
    p.add_argument("--es-snapshot-every", type=int, default=None)
    p.add_argument("--esrc-snapshot-every", type=int, default=100)
    p.add_argument("--delta-snapshot-frequency", type=int, default=100)
    p.add_argument("--keep", action="store_true", help="keep the databases")
    p.add_argument("--json", default=str(HERE / "out" / "compare.json"))
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="'' to skip the markdown")
    p.add_argument("--figures", default=str(HERE / "figures"), help="'' to skip the plots")
    p.add_argument("--from-json", default=None, help="only render markdown and plots from a JSON file")
    p.add_argument("--supplement", action="append", default=[],
                   help="with --from-json: fill sizes skipped in the main run (e.g. LangGraph "
                        "checkpoint-per-event at T=200) from another run's JSON; marked † in the tables")
    args = p.parse_args(argv)
    if args.quick:
        if args.turns == "10,50,200":
            args.turns = "10,50"
        args.repeats = min(args.repeats, 3)
        args.cell_seconds = min(args.cell_seconds, 2.0)
        if args.writers == "1,4,16":
            args.writers = "1,4"
        args.history_limit = min(args.history_limit, 10.0)
        args.event_budget = min(args.event_budget, 3.0)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        for extra in args.supplement:
            supplement(data, json.loads(Path(extra).read_text()), extra)
        return _render(data, args)

    options = {
        "es_snapshot_every": args.es_snapshot_every,
        "esrc_snapshot_every": args.esrc_snapshot_every,
        "delta_snapshot_frequency": args.delta_snapshot_frequency,
    }
    skip = {s for s in args.skip.split(",") if s}
    keys = [k for k in args.targets.split(",") if k and k not in skip]
    if "raw" not in keys:
        keys.insert(0, "raw")  # every ratio is against it
    turns_list = [int(x) for x in args.turns.split(",") if x]
    writers_list = [int(x) for x in args.writers.split(",") if x]

    data: dict[str, Any] = {
        "env": environment(),
        "command": "python -m benchmarks compare "
        + shlex.join(list(argv) if argv is not None else sys.argv[1:]),
        "seed": SEED,
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "results", "figures")},
        "targets": {},
    }
    t_start = time.perf_counter()
    ref = make_target("raw")
    ref.open("pairing")  # raw psycopg appends paired with every target's per-event phase
    for key in keys:
        why = unavailable(key, options)
        if why:
            data["targets"][key] = {"key": key, "label": key, "unavailable": why}
            print(f"[{key}] unavailable: {why}", flush=True)
            continue
        target = make_target(key, options)
        entry: dict[str, Any] = {
            "key": key, "label": target.label, "note": target.note,
            "per_event": target.per_event, "per_turn": target.per_turn,
            "sizes": {}, "concurrency": {},
        }
        data["targets"][key] = entry
        try:
            warm_up(target)
        except Exception as exc:  # noqa: BLE001
            entry["error"] = f"warm-up failed: {type(exc).__name__}: {exc}"
            print(f"[{key}] {entry['error']}", flush=True)
            traceback.print_exc()
            continue
        for t in turns_list:
            if key == "lg-event" and t > args.lg_event_max_turns:
                entry["sizes"][str(t)] = {"turns": t, "skipped": (
                    "not run: a checkpoint per event stores the whole state each time "
                    "(O(T^2) bytes); raise --lg-event-max-turns to run it")}
                continue
            t0 = time.perf_counter()
            try:
                res = run_size(target, t, args, ref)
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                res = {"turns": t, "error": f"{type(exc).__name__}: {exc}", "ok": False}
                try:
                    target.close()
                    _drop(target)
                except Exception as exc:  # noqa: BLE001 - the size's error is already recorded
                    print(f"[{key}] cleanup after the error failed: {exc}", flush=True)
            entry["sizes"][str(t)] = res
            print(f"[{key}] T={t}: {_brief(res)} ({time.perf_counter() - t0:.1f}s)", flush=True)
        _save(data, args)
    ref.close()
    _drop(ref)
    if not args.no_concurrency:
        for key in keys:
            entry = data["targets"][key]
            if entry.get("unavailable") or entry.get("error") or not entry.get("per_event"):
                continue
            for w in writers_list:
                try:
                    if key != "raw":
                        # A raw cell right before, for a ratio measured under the same noise.
                        paired = run_concurrency("raw", options, w, args.cell_seconds)
                    cell = run_concurrency(key, options, w, args.cell_seconds)
                    if key != "raw":
                        cell["raw_eps"] = paired["eps"]
                        cell["raw_p50_ms"] = paired["p50_ms"]
                        cell["raw_p99_ms"] = paired["p99_ms"]
                except Exception as exc:  # noqa: BLE001
                    traceback.print_exc()
                    cell = {"writers": w, "error": f"{type(exc).__name__}: {exc}"}
                entry["concurrency"][str(w)] = cell
                print(f"[{key}] W={w}: {cell.get('eps', 0):.0f} ev/s p50 {cell.get('p50_ms', 0):.2f} ms "
                      f"p99 {cell.get('p99_ms', 0):.2f} ms {cell.get('errors') or ''}", flush=True)
            _save(data, args)
    data["elapsed_s"] = time.perf_counter() - t_start
    _save(data, args)
    return _render(data, args)


def _brief(res: dict[str, Any]) -> str:
    if "error" in res:
        return "ERROR " + res["error"]
    f = lambda v, fmt: "-" if v is None else format(v, fmt)
    return (
        f"{'ok' if res['ok'] else 'WRONG'} turn {f(res.get('per_turn_eps'), '.0f')} ev/s, "
        f"event {f(res.get('per_event_eps'), '.0f')} ev/s, head {res['load_head_ms']:.2f} ms, "
        f"old {f(res.get('load_old_ms'), '.2f')} ms, history {res['history_ms']:.1f} ms, "
        f"{res['bytes_per_event']:.0f} B/ev"
        + ("" if res["ok"] else " " + "; ".join(res["problems"]))
    )


def _save(data: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=1, default=str))


def _render(data: dict[str, Any], args: argparse.Namespace) -> int:
    text = render(data)
    if args.results:
        write_section(text, Path(args.results))
    if args.figures:
        from benchmarks import plots

        plots.write_all(data, Path(args.figures))
    print(text)
    return 0


# --------------------------------------------------------------------------- report

SECTION = "## Versus peers"
NOTES_BEGIN = "<!-- versus-peers notes: kept when the tables are regenerated -->"
NOTES_END = "<!-- /versus-peers notes -->"
ES_KEYS = ("es-pg", "es-pg-rows", "es-sqlite")
#: The sealed store's bytes per event, against the bare row's (issue 27).
SEALED_BYTES_TARGET = 0.15


def _f(v: Any, digits: int = 0) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and math.isnan(v):
        return "–"
    if digits == 0:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def _ms(v: Any) -> str:
    if v is None:
        return "–"
    return _f(v, 2 if v < 10 else 1 if v < 100 else 0)


def _ratio(v: Any, base: Any) -> str:
    if v is None or base in (None, 0) or math.isnan(v) or math.isnan(base):
        return ""
    r = v / base
    return f" ({r:.2f}×)" if r < 10 else f" ({r:.1f}×)" if r < 100 else f" ({r:,.0f}×)"


def _pratio(r: dict[str, Any], key: str = "per_event_ratio") -> str:
    """Ratio to raw psycopg appends interleaved with the target's (same window, same noise)."""
    v = r.get(key)
    if v is None:
        return ""
    return f" ({v:.2f}×)" if v < 10 else f" ({v:.1f}×)"


def _targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    return list(data["targets"].values())


def _size(entry: dict[str, Any], t: int) -> dict[str, Any] | None:
    res = entry.get("sizes", {}).get(str(t))
    if not res or "error" in res or "skipped" in res:
        return None
    return res


def _status(entry: dict[str, Any], t: int) -> str:
    res = entry.get("sizes", {}).get(str(t))
    if res is None:
        return "not run"
    if "skipped" in res:
        return "skipped"
    if "error" in res:
        return "ERROR"
    return "ok" if res.get("ok") else "**WRONG**"


def render(data: dict[str, Any]) -> str:
    """The "## Versus peers" section as markdown (tables only; notes are kept separately)."""
    env = data["env"]
    raw = data["targets"].get("raw", {})
    turns = sorted({int(t) for e in _targets(data) for t in e.get("sizes", {})})
    lines = [SECTION, ""]
    lines += [
        (f"Run {env['date']} at `{env['commit']}`, in {data.get('elapsed_s', 0) / 60:.1f} min: "
        f"`cd /work/main && scripts/with-postgres .venv/bin/python -m benchmarks compare"
        f"{(' ' + data['command'].split('compare', 1)[1].strip()) if data['command'].split('compare', 1)[1].strip() else ''}`."),
        "Workload: `eventstore.samples.chat_session(T, seed=" + str(data["seed"]) + ")` (≈86 events per turn); "
        "every figure is also given as a ratio to raw psycopg **measured in the same run** "
        "(throughput: higher is better; time and bytes: lower is better). "
        "The machine is shared and noisy, so append ratios come from *alternating blocks*: after "
        "every " + f"{data['settings'].get('block', 0.25):g}" + " s of target writes, raw psycopg writes "
        "the same batches (turns, or single events) for as long, and the ratio is target ev/s ÷ raw "
        "ev/s over those blocks. Per-event figures are taken at session length T (appending the "
        "next turns one event per transaction, up to " + f"{data['settings']['event_budget']:g}" + " s "
        "of target time). The client CPU column (`time.process_time` of the benchmark process inside "
        "the timed appends) is the least noisy append figure: it does not wait on the disk. "
        "Reads are the median of " + str(data["settings"]["repeats"]) + " after one warm-up; read and byte "
        "ratios are against the raw row of the same size. Bytes are `pg_total_relation_size` "
        "(tables + indexes + TOAST, after `VACUUM FULL` and `VACUUM`: live data, without the free "
        "space a table reuses) of the target's own database, or the SQLite file (pages in use after "
        "a WAL checkpoint), measured once the target's background work is done (eventstore: "
        "`store.seal()`). \"bytes/event, whole db\" divides the whole database, empty schema "
        "included, by the session's events; \"bytes/event, +1 session\" is what a second session "
        "of the same length (another seed, written the same way, untimed) adds to that database, "
        "per event: the same rule for every target, it leaves out the fixed cost of the schema and "
        "of every table's and index's first pages (the empty schema's size is in the table of "
        "targets; a table in use also takes its first heap and index pages and, after VACUUM, "
        "its free-space and visibility maps: ~30–50 KB per table). \"bytes/event, 1 event/tx\" "
        "is what the per-event appends added, divided by their number (not for a sealing store: "
        "they close the turn left open before them, and its sealing is most of the difference; "
        "events written one per transaction are sealed like the others).",
        "",
        "Machine and versions:",
        "",
        "```",
        env["uname"],
        f"nproc: {env['nproc']}",
        env["free"],
        f"Python {env['python']}, PostgreSQL {env['postgresql']}, SQLite {env['sqlite']}",
        ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        "```",
        "",
        "| key | target | configuration | empty schema (KB) |",
        "|---|---|---|--:|",
    ]
    for e in _targets(data):
        conf = e.get("note") or e.get("unavailable") or ""
        if e.get("error"):
            conf += f" — **{e['error']}**"
        empty = next((r["empty_bytes"] for r in e.get("sizes", {}).values() if "empty_bytes" in r), None)
        lines.append(f"| `{e['key']}` | {e['label']} | {conf} | {_f(None if empty is None else empty / 1024)} |")
    lines.append("")

    for t in turns:
        base = _size(raw, t) or {}
        n = base.get("events") or next(((_size(e, t) or {}).get("events") for e in _targets(data) if _size(e, t)), None)
        lines += [
            f"### T = {t} turns ({_f(n)} events; old version = end of turn {t // 2})",
            "",
            ("| target | state | append, 1 event/tx (ev/s) | client CPU per 1-event append (ms) "
            "| append, 1 turn/tx (ev/s) | load head (ms) "
            "| load old version (ms) | full history (ms) | bytes/event, whole db | bytes/event, +1 session "
            "| bytes/event, 1 event/tx |"),
            "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        supplements: list[str] = []
        for e in _targets(data):
            if e.get("unavailable"):
                continue
            r = _size(e, t)
            st = _status(e, t)
            if r is None:
                why = (e.get("sizes", {}).get(str(t)) or {}).get("skipped") or (e.get("sizes", {}).get(str(t)) or {}).get("error") or e.get("error", "")
                lines.append(f"| {e['label']} | {st} | {why} | | | | | | | | |")
                continue
            if r.get("supplement"):
                base = r.get("supplement_raw") or {}
                supplements.append(f"† `{e['label']}` at T = {t}: from a separate run, "
                                   f"`{r['supplement']}`; its ratios are against raw psycopg of that run.")
            hist = _ms(r["history_ms"]) + _ratio(r["history_ms"], base.get("history_ms"))
            if not r.get("history_complete", True):
                hist = f"> {_ms(r['history_ms'])} (stopped after {r['history_items']} items)"
            lines.append(
                f"| {e['label']}{' †' if r.get('supplement') else ''} | {st} "
                f"| {_f(r.get('per_event_eps'))}{_pratio(r)} "
                f"| {_ms(r.get('per_event_cpu_ms') if r.get('per_event_eps') else None)}"
                f"{_ratio(r.get('per_event_cpu_ms') if r.get('per_event_eps') else None, base.get('per_event_cpu_ms'))} "
                f"| {_f(r.get('per_turn_eps'))}{_pratio(r, 'per_turn_ratio')} "
                f"| {_ms(r['load_head_ms'])}{_ratio(r['load_head_ms'], base.get('load_head_ms'))} "
                f"| {_ms(r.get('load_old_ms'))}{_ratio(r.get('load_old_ms'), base.get('load_old_ms'))} "
                f"| {hist} "
                f"| {_f(r['bytes_per_event'])}{_ratio(r['bytes_per_event'], base.get('bytes_per_event'))} "
                f"| {_f(r.get('marginal_bytes_per_event'))}"
                f"{_ratio(r.get('marginal_bytes_per_event'), base.get('marginal_bytes_per_event'))} "
                f"| {_f(r.get('bytes_per_event_single'))}"
                f"{_ratio(r.get('bytes_per_event_single'), base.get('bytes_per_event_single'))} |"
            )
            base = _size(raw, t) or {}
        problems = [f"{e['label']}: {'; '.join(_size(e, t)['problems'])}" for e in _targets(data)
                    if _size(e, t) and _size(e, t)["problems"]]
        lines.append("")
        lines += [x + "\n" for x in supplements]
        lines.append("Checked against the reference fold (head, old version, head after the per-event appends): "
                     + ("every target correct." if not problems else "**" + " / ".join(problems) + "**"))
        lines.append("")

    if len(turns) >= 2:
        lo, hi = turns[0], turns[-1]
        lines += [
            f"### Growth from T = {lo} to T = {hi}",
            "",
            (f"| target | bytes/event T={lo} | bytes/event T={hi} | growth | load head T={lo} (ms) "
            f"| load head T={hi} (ms) | growth |"),
            "|---|--:|--:|--:|--:|--:|--:|",
        ]
        for e in _targets(data):
            a, b = _size(e, lo), _size(e, hi)
            if e.get("unavailable") or a is None:
                continue
            if b is None:
                lines.append(f"| {e['label']} | {_f(a['bytes_per_event'])} | {_status(e, hi)} | | "
                             f"{_ms(a['load_head_ms'])} | {_status(e, hi)} | |")
                continue
            lines.append(
                f"| {e['label']} | {_f(a['bytes_per_event'])} | {_f(b['bytes_per_event'])} "
                f"| {b['bytes_per_event'] / a['bytes_per_event']:.2f}× | {_ms(a['load_head_ms'])} "
                f"| {_ms(b['load_head_ms'])} | {b['load_head_ms'] / a['load_head_ms']:.2f}× |"
            )
        lines.append("")

    writers = sorted({int(w) for e in _targets(data) for w in e.get("concurrency", {})})
    if writers:
        secs = data["settings"]["cell_seconds"]
        lines += [
            f"### Concurrent writers (one event per transaction, each writer its own session, {secs:g} s per cell, processes)",
            "",
            ("Each target's cell runs right after a raw psycopg cell with the same number of writers; "
            "the ratio and the raw latencies in brackets are from that paired cell."),
            "",
            "| target | " + " | ".join(f"W={w}: ev/s | W={w}: p50 / p99 ms" for w in writers) + " |",
            "|---|" + "--:|--:|" * len(writers),
        ]
        for e in _targets(data):
            cells = e.get("concurrency", {})
            if not cells:
                continue
            row = [e["label"]]
            for w in writers:
                c, rc = cells.get(str(w)), raw.get("concurrency", {}).get(str(w), {})
                if not c or "error" in c:
                    row += [("ERROR " + c["error"]) if c else "–", ""]
                    continue
                fail = f" ({c['failed_appends']} failed)" if c.get("failed_appends") else ""
                row.append(f"{_f(c['eps'])}{_ratio(c['eps'], c.get('raw_eps', rc.get('eps')))}{fail}")
                paired = (f" (raw {_ms(c['raw_p50_ms'])} / {_ms(c['raw_p99_ms'])})"
                          if "raw_p50_ms" in c else "")
                row.append(f"{_ms(c['p50_ms'])} / {_ms(c['p99_ms'])}{paired}")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")

    lines += _verdicts(data, turns)
    lines += [
        "![bytes per session vs session length](figures/compare-bytes.png)",
        "![load head vs session length](figures/compare-load-head.png)",
        "![append throughput](figures/compare-append.png)",
        "![concurrent writers](figures/compare-concurrency.png)",
        "",
    ]
    return "\n".join(lines)


def _verdicts(data: dict[str, Any], turns: list[int]) -> list[str]:
    """Issue 5's targets, checked mechanically on this run's numbers, at every size."""
    out: list[str] = []
    for t in turns:
        es = _size(data["targets"].get("es-pg", {}), t)
        peers = [(e["label"], _size(e, t)) for e in _targets(data)
                 if e["key"] not in ES_KEYS + ("raw",) and _size(e, t)]
        if not es or not peers:
            continue

        def best(metric: str, high: bool, peers: list[Any] = peers) -> tuple[str, float]:
            vals = [(lbl, r[metric]) for lbl, r in peers
                    if r.get(metric) is not None and r.get("ok")
                    and (not metric.startswith("per_event") or r.get("per_event_eps"))]
            if not vals:
                return ("–", float("nan"))
            return (max if high else min)(vals, key=lambda x: x[1])

        out += [f"### Issue 5 targets, eventstore on PostgreSQL at T = {t}", ""]
        # Compared as ratios to raw blocks alternating with each target: robust to machine noise.
        metric = "per_event_ratio" if es.get("per_event_ratio") is not None else "per_event_eps"
        lbl, v = best(metric, True)
        fmt = (lambda x: f"{x:.2f}× raw") if metric == "per_event_ratio" else (lambda x: f"{_f(x)} ev/s")
        out.append(f"- beats every peer on append per event: "
                   f"{'met' if es[metric] > v else '**not met**'} "
                   f"({fmt(es[metric])} vs best peer {lbl} {fmt(v)})")
        lbl, v = best("per_event_cpu_ms", False)
        if es.get("per_event_cpu_ms") is not None and not math.isnan(v):
            out.append(f"- … and on client CPU per 1-event append (noise-robust): "
                       f"{'met' if es['per_event_cpu_ms'] < v else '**not met**'} "
                       f"({_ms(es['per_event_cpu_ms'])} ms vs best peer {lbl} {_ms(v)} ms)")
        metric = "marginal_bytes_per_event" if es.get("marginal_bytes_per_event") is not None else "bytes_per_event"
        lbl, v = best(metric, False)
        out.append(f"- beats every peer on bytes per event ({'+1 session' if metric != 'bytes_per_event' else 'whole db'}): "
                   f"{'met' if es[metric] < v else '**not met**'} "
                   f"({_f(es[metric])} B vs best peer {lbl} {_f(v)} B)")
        lbl, v = best("bytes_per_event_single", False)
        if es.get("bytes_per_event_single") is not None and not math.isnan(v):
            out.append(f"- … and on bytes per event written one per transaction: "
                       f"{'met' if es['bytes_per_event_single'] < v else '**not met**'} "
                       f"({_f(es['bytes_per_event_single'])} B vs best peer {lbl} {_f(v)} B)")
        lbl, v = best("load_head_ms", False)
        out.append(f"- load head within 1.0× of the best peer: "
                   f"{'met' if es['load_head_ms'] <= v else '**not met**'} "
                   f"({_ms(es['load_head_ms'])} ms vs {lbl} {_ms(v)} ms: "
                   f"{es['load_head_ms'] / v:.2f}×)")
        r = es.get("per_event_ratio")
        if r is not None:
            out.append(f"- append per event ≥ 0.8× raw psycopg (alternating blocks): "
                       f"{'met' if r >= 0.8 else '**not met**'} ({r:.2f}×)")
        out.append("")
        out += _sealing_verdicts(data, t, es)
    return out


def _sealing_verdicts(data: dict[str, Any], t: int, es: dict[str, Any]) -> list[str]:
    """Issue 27's targets for eventstore with sealing on, on this run's numbers at size ``t``."""
    raw = _size(data["targets"].get("raw", {}), t)
    rows = _size(data["targets"].get("es-pg-rows", {}), t)
    if not raw or es.get("marginal_bytes_per_event") is None:
        return []
    out = [f"### Issue 27 targets, eventstore on PostgreSQL with sealing on, at T = {t}", ""]
    m, base = es["marginal_bytes_per_event"], raw["marginal_bytes_per_event"]
    out.append(f"- bytes per event ≤ {SEALED_BYTES_TARGET}× the bare row (+1 session): "
               f"{'met' if m <= SEALED_BYTES_TARGET * base else '**not met**'} "
               f"({_f(m, 1)} B vs {_f(base, 1)} B: {m / base:.3f}×; whole db {_f(es['bytes_per_event'])} B vs "
               f"{_f(raw['bytes_per_event'])} B: {es['bytes_per_event'] / raw['bytes_per_event']:.2f}×)")
    for key in ("lg-delta", "lg-turn", "es-pg-rows"):
        peer = _size(data["targets"].get(key, {}), t)
        if peer and peer.get("marginal_bytes_per_event") is not None:
            out.append(f"  - {data['targets'][key]['label']} in the same run: "
                       f"{_f(peer['marginal_bytes_per_event'], 1)} B "
                       f"({peer['marginal_bytes_per_event'] / base:.3f}×; whole db "
                       f"{peer['bytes_per_event'] / raw['bytes_per_event']:.2f}×)")
    if rows:
        a, b = es.get("per_turn_ratio"), rows.get("per_turn_ratio")
        if a is not None and b is not None:
            out.append(f"- append per turn with sealing against without (each ÷ its raw blocks): "
                       f"{a:.2f}× raw against {b:.2f}× raw ({a / b:.2f})")
        a, b = es.get("per_event_ratio"), rows.get("per_event_ratio")
        if a is not None and b is not None:
            out.append(f"- append per event with sealing against without: {a:.2f}× raw against "
                       f"{b:.2f}× raw ({a / b:.2f}); client CPU {_ms(es['per_event_cpu_ms'])} against "
                       f"{_ms(rows['per_event_cpu_ms'])} ms")
        if es.get("load_old_ms") and rows.get("load_old_ms"):
            ratio = es["load_old_ms"] / rows["load_old_ms"]
            out.append(f"- old-version checkout within 2× of every event a row: "
                       f"{'met' if ratio <= 2 else '**not met**'} ({_ms(es['load_old_ms'])} against "
                       f"{_ms(rows['load_old_ms'])} ms: {ratio:.2f}×)")
        out.append(f"- load head with sealing against without: {_ms(es['load_head_ms'])} against "
                   f"{_ms(rows['load_head_ms'])} ms")
    for key in ("lg-turn", "lg-delta"):
        peer = _size(data["targets"].get(key, {}), t)
        if peer:
            out.append(f"  - {data['targets'][key]['label']}: load head {_ms(peer['load_head_ms'])} ms, "
                       f"old version {_ms(peer.get('load_old_ms'))} ms")
    out.append("")
    return out


def write_section(text: str, path: Path) -> None:
    """Replace (or append) the "## Versus peers" section of RESULTS.md, keeping the notes block."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    notes = ""
    start = old.find(SECTION + "\n")
    if start >= 0:
        nxt = old.find("\n## ", start + len(SECTION))
        end = len(old) if nxt < 0 else nxt + 1
        body = old[start:end]
        a, b = body.find(NOTES_BEGIN), body.find(NOTES_END)
        if a >= 0 and b > a:
            notes = body[a : b + len(NOTES_END)]
        before, after = old[:start], old[end:]
    else:
        before, after = old.rstrip("\n") + "\n\n", ""
    if not notes:
        notes = NOTES_BEGIN + "\n" + NOTES_END
    section = text.rstrip("\n") + "\n\n" + notes + "\n"
    path.write_text(before + section + ("\n" + after if after else ""))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
