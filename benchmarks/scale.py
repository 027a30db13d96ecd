"""Scale benchmark: session partitions against plain tables, a growth simulation, replicas.

Run (PostgreSQL and its streaming replica come from scripts/with-postgres)::

    scripts/with-postgres .venv/bin/python -m benchmarks scale             # ~8 min
    scripts/with-postgres .venv/bin/python -m benchmarks scale --quick     # ~2 min
    ... --fill-seconds 600   # grow the schemas for this long in all (default 240)
    ... --part compare       # only this part (repeatable: compare, growth, replicas); its
                             # subsection of the "## Scale" section is replaced, the rest kept
    ... --blocks 80          # alternating blocks of the partitioned-vs-plain part (default 40)
    ... --no-record          # do not rewrite the "## Scale" section of benchmarks/RESULTS.md

Three parts, every figure against a baseline measured in the same run on the same server:

1. **Partitioned vs plain.** Two schemas, one created with ``partitions=16``, both
   pre-filled with the same sessions; then appends (one event per transaction, alternating
   blocks on a growing session), head loads of random sessions (alternating) and bytes per
   event (tables + indexes + snapshots). Target: partitioned within 10% of plain.
2. **Growth.** A plain and a partitioned schema are filled in turns with the same chat
   sessions for ``--fill-seconds``; at every checkpoint the median latency of a one-event
   append, a head load and a checkout of an old version is measured on random sessions,
   the two schemas taking turns. Target: flat — the last filled checkpoint within 1.5x of
   the first.
3. **Replicas.** Reader processes load random sessions while writer processes append, for
   a fixed time, once through primary-only stores and once through stores with
   ``replicas=[replica]``; reads/s and appends/s of each. Plus the cost of read-your-writes:
   an append then a head load through one replicated store, against the same through a
   primary-only store.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import random
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg

from benchmarks._common import count_events, machine, record_section
from eventstore.samples import chat_session
from eventstore import EventStore

__all__ = ["main"]

SECTION = "## Scale"
OUT = Path(__file__).parent / "out" / "scale.json"
RESULTS = Path(__file__).parent / "RESULTS.md"
PARTITION_COUNTS = (4, 8, 16)
#: Head loads per block of the partitioned-vs-plain part (a block of 10 lasted ~8 ms: a
#: scheduler hiccup of the shared machine moved its ratio by tens of percent).
LOADS_PER_BLOCK = 40
#: The three parts, in the order they run, and the title of each one's subsection.
PARTS = {
    "compare": "### Partitioned (hash partitions by session) vs plain tables",
    "growth": "### Growth",
    "replicas": "### Read replicas under concurrent writers",
}
#: The partition count of the growth simulation.
PARTITIONS = 8
SEND = {"type": "send", "id": "u-x", "text": "one more question"}


# ----------------------------------------------------------------------------- helpers


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextmanager
def _schema(admin_url: str, tag: str) -> Iterator[str]:
    """A fresh schema; yields a URL whose search_path is it (dropped afterwards)."""
    schema = f"scale_{tag}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_dsn(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{admin_url}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(_dsn(admin_url), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _on_server(url: str, base: str) -> str:
    """``url`` (a schema URL of the primary) pointed at the server of ``base``."""
    return base + url[url.index("?") :]


def _size(url: str) -> tuple[int, int]:
    """(events, bytes of every eventstore table with indexes and TOAST) in the schema."""
    with psycopg.connect(_dsn(url)) as conn:
        (total,) = conn.execute(  # type: ignore[misc]
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
            "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'"
        ).fetchone()
    # Sealing deletes a closed turn's rows: its events are counted in their segments.
    return count_events(_dsn(url)), int(total or 0)


def _fill(store: EventStore, prefix: str, sessions: int, seed: int, turns: int = 2) -> int:
    """Record ``sessions`` whole chats (one append each); the number of events."""
    n = 0
    for i in range(sessions):
        actions = chat_session(turns, seed=seed + i, deltas=40)
        store.append(f"{prefix}{i}", actions, actor="bench")
        n += len(actions)
    return n


# ------------------------------------------------------------------ 1: partitioned vs plain


def compare_partitioned(admin: str, *, sessions: int, blocks: int) -> dict[str, Any]:
    """Append, head load and bytes/event, plain against each partition count, alternating."""
    counts = (0, *PARTITION_COUNTS)
    with ExitStack() as stack:
        urls = {n: stack.enter_context(_schema(admin, f"p{n}")) for n in counts}
        stores = {n: stack.enter_context(EventStore(urls[n], partitions=n)) for n in counts}
        for store in stores.values():
            store.migrate()
            _fill(store, "s", sessions, seed=1)
        rng = random.Random(2)
        appends: dict[int, list[float]] = {n: [] for n in counts}
        loads: dict[int, list[float]] = {n: [] for n in counts}
        for b in range(blocks):
            order = counts[b % len(counts) :] + counts[: b % len(counts)]  # who goes first rotates
            for n in order:
                t0 = time.perf_counter()
                for _ in range(20):
                    stores[n].append("grow", [SEND])
                appends[n].append((time.perf_counter() - t0) / 20)
            picks = [f"s{rng.randrange(sessions)}" for _ in range(LOADS_PER_BLOCK)]
            for n in order:
                t0 = time.perf_counter()
                for sid in picks:
                    stores[n].load(sid)
                loads[n].append((time.perf_counter() - t0) / LOADS_PER_BLOCK)
        sizes = {n: _size(urls[n]) for n in counts}
    bpe = {n: sizes[n][1] / sizes[n][0] for n in counts}
    rows = []
    for n in counts:
        # plain time / this time per block (> 1: faster than plain): median and quartiles
        append_q = _quartiles([p / q for p, q in zip(appends[0], appends[n])])
        load_q = _quartiles([p / q for p, q in zip(loads[0], loads[n])])
        rows.append(
            {
                "partitions": n,
                "append_ms": statistics.median(appends[n]) * 1e3,
                "load_ms": statistics.median(loads[n]) * 1e3,
                "bytes_per_event": bpe[n],
                "append_ratio": append_q[1],
                "append_quartiles": [append_q[0], append_q[2]],
                "load_ratio": load_q[1],
                "load_quartiles": [load_q[0], load_q[2]],
                "bytes_ratio": bpe[n] / bpe[0],
            }
        )
    return {
        "sessions": sessions,
        "events": sizes[0][0],
        "blocks": blocks,
        "loads_per_block": LOADS_PER_BLOCK,
        "rows": rows,
    }


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


# ----------------------------------------------------------------------------- 2: growth


def _paired_ms(ops: dict[int, Callable[[], Any]], n: int) -> dict[int, float]:
    """Median ms of each op, the ops taking turns one call at a time (same machine state)."""
    samples: dict[int, list[float]] = {k: [] for k in ops}
    for i in range(n):
        keys = list(ops) if i % 2 == 0 else list(reversed(list(ops)))
        for k in keys:
            t0 = time.perf_counter()
            ops[k]()
            samples[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def grow(admin: str, *, counts: tuple[int, ...], seconds: float, checkpoints: int) -> list[Any]:
    """Fill one schema per partition count with the same chats, in turns, for ``seconds``
    in all; the latencies of each, measured in turns, at every checkpoint."""
    with ExitStack() as stack:
        urls = {n: stack.enter_context(_schema(admin, f"grow{n}")) for n in counts}
        stores = {n: stack.enter_context(EventStore(urls[n], partitions=n)) for n in counts}
        rows: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
        for store in stores.values():
            store.migrate()
            # A few long-lived sessions that keep growing, like the chats in use right now.
            for i in range(4):
                store.append(f"live{i}", chat_session(1, seed=900 + i), actor="bench")
        rng = random.Random(3)
        sessions = 0
        for step in range(checkpoints + 1):
            if step:
                deadline = time.perf_counter() + seconds / checkpoints
                while time.perf_counter() < deadline:
                    for store in stores.values():
                        _fill(store, f"s{sessions}-", 20, seed=sessions)
                    sessions += 20
            names = (
                [f"s{rng.randrange(sessions // 20) * 20}-{rng.randrange(20)}" for _ in range(60)]
                if sessions
                else [f"live{i}" for i in range(4)]
            )
            live = {n: iter(range(10**9)) for n in counts}
            pick = {n: random.Random(step) for n in counts}  # the same sessions on each side

            def append(n: int) -> Callable[[], Any]:
                return lambda: stores[n].append(f"live{next(live[n]) % 4}", [SEND])

            def head(n: int) -> Callable[[], Any]:
                return lambda: stores[n].load(pick[n].choice(names))

            def old(n: int) -> Callable[[], Any]:
                return lambda: stores[n].load(
                    pick[n].choice(names), version=pick[n].randrange(1, 80)
                )

            # The lowest of three 40-call medians: a stall of the shared disk (another
            # program's fsyncs, a checkpoint) must not pose as growth of the tables.
            figures: dict[str, dict[int, float]] = {}
            for name, make in (("append_ms", append), ("head_ms", head), ("checkout_ms", old)):
                runs = [_paired_ms({n: make(n) for n in counts}, 40) for _ in range(3)]
                figures[name] = {n: min(r[n] for r in runs) for n in counts}
            for n in counts:
                events, size = _size(urls[n])
                row = {"sessions": sessions, "events": events, "bytes": size}
                row.update({name: figures[name][n] for name in figures})
                rows[n].append(row)
                print(f"  partitions={n} {row}", flush=True)
    out = []
    for n in counts:
        # The empty schema's figures are shown but are not the baseline: growth is measured
        # from the first filled checkpoint to the last.
        first, last = rows[n][1], rows[n][-1]
        out.append(
            {
                "partitions": n,
                "rows": rows[n],
                "growth": {k: last[k] / first[k] for k in ("append_ms", "head_ms", "checkout_ms")},
            }
        )
    return out


# ----------------------------------------------------------------------------- 3: replicas


def _loop(op: Callable[[], Any], stop: Any, count: Any) -> None:
    """Run ``op`` until stopped, adding to the shared count every 10 operations."""
    n = 0
    while not stop.is_set():
        op()
        n += 1
        if n == 10:
            with count.get_lock():
                count.value += n
            n = 0


def _writer(url: str, tag: str, stop: Any, count: Any) -> None:
    with EventStore(url) as store:
        _loop(lambda: store.append(f"w-{tag}", [SEND]), stop, count)


def _reader(url: str, replicas: list[str], sessions: int, stop: Any, count: Any) -> None:
    options: dict[str, Any] = {"replicas": replicas} if replicas else {}
    rng = random.Random(os.getpid())
    with EventStore(url, **options) as store:
        _loop(lambda: store.load(f"s{rng.randrange(sessions)}"), stop, count)


def _proc_stat(pid: str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state first)."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        return f.read().rsplit(")", 1)[1].split()


def _server_cpu(url: str) -> Callable[[], float]:
    """A clock of the CPU seconds a local PostgreSQL server has used: its postmaster and
    every backend or worker (Linux ``/proc``; exited backends are counted once the
    postmaster has reaped them)."""
    with psycopg.connect(_dsn(url)) as conn:
        (backend,) = conn.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
    postmaster = _proc_stat(str(backend))[1]
    tick = os.sysconf("SC_CLK_TCK")

    def used() -> float:
        own = _proc_stat(postmaster)
        total = sum(int(x) for x in own[11:15])  # utime stime cutime cstime
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                st = _proc_stat(pid)
            except OSError:
                continue  # gone meanwhile
            if st[1] == postmaster:
                total += int(st[11]) + int(st[12])
        return total / tick

    return used


def _mixed(
    url: str,
    replicas: list[str],
    sessions: int,
    writers: int,
    readers: int,
    seconds: float,
    cpu: dict[str, Callable[[], float]],
) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    writes, reads = ctx.Value("q", 0), ctx.Value("q", 0)
    procs = [ctx.Process(target=_writer, args=(url, f"{i}-{uuid.uuid4().hex[:6]}", stop, writes))
             for i in range(writers)]
    procs += [ctx.Process(target=_reader, args=(url, replicas, sessions, stop, reads))
              for _ in range(readers)]
    for p in procs:
        p.start()
    time.sleep(3.0)  # start-up (imports, connections) is not measured
    c0 = {k: used() for k, used in cpu.items()}
    w0, r0, t0 = writes.value, reads.value, time.perf_counter()
    time.sleep(seconds)
    w1, r1, elapsed = writes.value, reads.value, time.perf_counter() - t0
    c1 = {k: used() for k, used in cpu.items()}
    stop.set()
    for p in procs:
        p.join(60)
    out = {"reads_per_s": (r1 - r0) / elapsed, "writes_per_s": (w1 - w0) / elapsed}
    # Server CPU, in cores busy on average over the window.
    out.update({f"{k}_cores": (c1[k] - c0[k]) / elapsed for k in cpu})
    return out


def replicas(
    admin: str, replica: str, *, sessions: int, seconds: float, rounds: int
) -> dict[str, Any]:
    """Read throughput under concurrent writers, primary-only vs one replica; RYW cost."""
    with _schema(admin, "repl") as url:
        with EventStore(url) as store:
            store.migrate()
            _fill(store, "s", sessions, seed=5)
        replica_url = _on_server(url, replica)
        cpu = {"primary": _server_cpu(admin), "replica": _server_cpu(replica)}
        out: dict[str, Any] = {"sessions": sessions, "seconds": seconds, "rounds": rounds}
        for readers in (2, 4):
            runs: dict[str, list[dict[str, float]]] = {"primary_only": [], "replica": []}
            for r in range(rounds):
                order = [("primary_only", []), ("replica", [replica_url])]
                if r % 2:
                    order.reverse()
                for name, reps in order:
                    runs[name].append(_mixed(url, reps, sessions, 2, readers, seconds, cpu))
            for name, got in runs.items():
                out[f"{name}_r{readers}"] = {
                    k: statistics.median(g[k] for g in got) for k in got[0]
                }
            print(f"  readers={readers} {runs}", flush=True)
        # Read-your-writes: append one event, then load the head, through one store.
        with ExitStack() as stack:
            stores = {
                "primary_only": EventStore(url),
                "replica": EventStore(url, replicas=[replica_url]),
                "replica_wait0": EventStore(url, replicas=[replica_url], replica_wait=0),
            }
            for store in stores.values():
                stack.enter_context(store)

            def ryw(name: str) -> Callable[[], Any]:
                store = stores[name]
                return lambda: (store.append(f"ryw-{name}", [SEND]), store.load(f"ryw-{name}"))

            ryw_ms = _paired_ms({i: ryw(name) for i, name in enumerate(stores)}, 200)
            out["ryw_ms"] = {name: ryw_ms[i] for i, name in enumerate(stores)}
            out["ryw_served"] = {
                name: store.read_counts for name, store in stores.items()
            }
    return out


# ----------------------------------------------------------------------------- report


def _flag(met: bool) -> str:
    return "" if met else " **(no)**"


def _pct(r: float) -> str:
    return f"{(r - 1) * 100:+.1f}%"


def _measured(res: dict[str, Any], part: str) -> str:
    flags = res.get("flags", " --quick" if res["quick"] else "")
    return (
        f"Measured {res['date']} "
        f"(`scripts/with-postgres .venv/bin/python -m benchmarks scale{flags}`)."
    )


def render_header(res: dict[str, Any]) -> str:
    """The top of the ``## Scale`` section: the command and the machine."""
    m = res["machine"]
    return "\n".join(
        [
            SECTION,
            "",
            "Command: `scripts/with-postgres .venv/bin/python -m benchmarks scale` (all three "
            "parts; `--part compare|growth|replicas` reruns one, replacing only its subsection: "
            "each subsection says when it was measured).",
            "",
            f"Machine: `{m['uname']}`, nproc {m['nproc']}, Python {m['python']}; {res['server']} "
            "(fsync on), primary and its streaming replica on the same machine; "
            f"disk free at the start: {res['disk_free_gb']:.0f} GB. The machine is shared with "
            "other work (other agents' builds and tests; load average above its 2 cores during "
            "the runs): ratios measured in alternating blocks are the figures to trust, absolute "
            "times are indicative.",
            "",
        ]
    )


def render_compare(res: dict[str, Any]) -> str:
    """The partitioned-vs-plain subsection."""
    c = res["compare"]
    lines = [
        PARTS["compare"],
        "",
        _measured(res, "compare"),
        "",
        f"Four schemas — plain, and {', '.join(map(str, PARTITION_COUNTS))} partitions — each "
        f"pre-filled with the same {c['sessions']} chats ({c['events']:,} events, "
        f"`chat_session(2)`), then {c['blocks']} blocks of 20 appends on a growing session and "
        f"{c.get('loads_per_block', 10)} head loads of random chats, the schemas taking turns "
        "(who goes first rotates); a "
        "ratio is plain time ÷ partitioned time per block, median over blocks with the middle "
        "half of the blocks in brackets (above 1: partitioned is faster). "
        "Target: within 10% (ratio ≥ 0.9, bytes ≤ +10%).",
        "",
        "| partitions | append 1 event/txn | × plain | load head | × plain | bytes/event "
        "| vs plain |",
        "|--:|--:|--:|--:|--:|--:|--:|",
    ]

    def ratio(r: dict[str, Any], key: str) -> str:
        lo, hi = r.get(f"{key}_quartiles", (r[f"{key}_ratio"],) * 2)
        spread = "" if not r["partitions"] else f" ({lo:.2f}–{hi:.2f})"
        return f"{r[f'{key}_ratio']:.2f}{spread}{_flag(r[f'{key}_ratio'] >= 0.9)}"

    for r in c["rows"]:
        lines.append(
            f"| {r['partitions'] or 'plain'} | {r['append_ms']:.3f} ms | {ratio(r, 'append')} | "
            f"{r['load_ms']:.3f} ms | {ratio(r, 'load')} | {r['bytes_per_event']:.0f} | "
            f"{_pct(r['bytes_ratio'])}{_flag(r['bytes_ratio'] <= 1.1)} |"
        )
    lines += ["", COMPARE_NOTES, ""]
    return "\n".join(lines)


#: What the partitioned-vs-plain figures mean (kept with the code that measures them).
COMPARE_NOTES = (
    "Why partitions cost (almost) nothing here: every hot statement names the session's key "
    "as a value known when its execution starts — the one-statement load (head or an old "
    "version) and the appends' lookup of the previous event — so the cached generic plan "
    "of the prepared statement prunes the other partitions of `events` and `snapshots` at "
    "executor start-up. The storage learns a session's key from the first load, lookup, "
    "lock or insert of it (keys never change and are never given to another id). Before "
    "that, the load named only the session id and learnt the key from the session row, so "
    "each execution set up a scan of every partition and pruned at run time: head loads "
    "ran 0.89×, 0.88×, 0.73× the plain throughput at 4, 8, 16 partitions in the run before "
    "this change. What remains grows with the count: a generic plan still locks every "
    "partition it could read (PostgreSQL 15), and with 16 partitions of two tables that "
    "is more locks than a backend's fast-path slots. Bytes/event: about 90 KB of empty "
    "table and index pages per partition, a share that shrinks as the tables grow (see the "
    "growth tables)."
)


def render_growth(res: dict[str, Any]) -> str:
    """The growth subsection."""
    lines = [
        PARTS["growth"],
        "",
        _measured(res, "growth"),
        "",
        "A plain and a partitioned schema filled in turns with the same whole chats "
        "(`chat_session(2)`, ≈172 events, one append each) for "
        f"{res['fill_seconds']:.0f} s in all, the most this machine writes in the benchmark's "
        "budget (size on disk below); at each checkpoint one-event appends (to 4 live chats), "
        "head loads and checkouts of an old version (1–80) of random chats, the two schemas "
        "taking turns call by call; each figure is the lowest of three 40-call medians, so that "
        "a stall of the shared disk does not pose as growth. An append's time is mostly its "
        "commit's WAL flush on a disk other programs use too: it moves by up to 2× between "
        "checkpoints in either direction, with or without partitions; head loads and "
        "checkouts read cached pages and are the figures that would show the tables' growth.",
        "",
    ]
    for g in res["growth"]:
        label = f"{g['partitions']} partitions" if g["partitions"] else "plain tables"
        lines += [
            f"**{label}** — last ÷ first filled checkpoint: "
            f"append {g['growth']['append_ms']:.2f}×, head load {g['growth']['head_ms']:.2f}×, "
            f"old checkout {g['growth']['checkout_ms']:.2f}× "
            "(target ≤ 1.5×: "
            + ("met" if max(g["growth"].values()) <= 1.5 else "**not met**")
            + ")",
            "",
            "| sessions | events | size MB | bytes/event | append ms | head load ms "
            "| old checkout ms |",
            "|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for r in g["rows"]:
            lines.append(
                f"| {r['sessions']:,} | {r['events']:,} | {r['bytes'] / 1e6:.0f} | "
                f"{r['bytes'] / r['events']:.0f} | "
                f"{r['append_ms']:.3f} | {r['head_ms']:.3f} | {r['checkout_ms']:.3f} |"
            )
        lines.append("")
    plain, part = res["growth"][0]["rows"][-1], res["growth"][-1]["rows"][-1]
    lines += [
        f"At the last checkpoint ({plain['events']:,} events, "
        f"{plain['bytes'] / 1e6:.0f} MB plain, {part['bytes'] / 1e6:.0f} MB partitioned), "
        "partitioned time ÷ plain time: "
        + ", ".join(
            f"{label} {part[k] / plain[k]:.2f}×"
            for label, k in (
                ("append", "append_ms"), ("head load", "head_ms"), ("old checkout", "checkout_ms")
            )
        )
        + ".",
        "",
    ]
    return "\n".join(lines)


def render_replicas(res: dict[str, Any]) -> str:
    """The read-replica subsection."""
    rp = res["replicas"]
    lines = [
        PARTS["replicas"],
        "",
        _measured(res, "replicas"),
        "",
        f"{rp['sessions']} chats; 2 writer processes append one event per transaction to their "
        f"own sessions through primary-only stores while reader processes load the head of "
        f"random chats for {rp['seconds']:.0f} s, through primary-only stores or through stores "
        f"with `replicas=[replica]`, the two alternating over {rp['rounds']} rounds (medians).",
        "",
        "| readers | reads/s primary-only | reads/s via replica | × "
        "| appends/s (primary-only readers) | appends/s (replica readers) | × |",
        "|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for n in (2, 4):
        a, b = rp[f"primary_only_r{n}"], rp[f"replica_r{n}"]
        lines.append(
            f"| {n} | {a['reads_per_s']:.0f} | {b['reads_per_s']:.0f} | "
            f"{b['reads_per_s'] / a['reads_per_s']:.2f}× | {a['writes_per_s']:.0f} | "
            f"{b['writes_per_s']:.0f} | {b['writes_per_s'] / a['writes_per_s']:.2f}× |"
        )
    if "primary_cores" in rp["primary_only_r2"]:
        lines += [
            "",
            "Where the servers' CPU went, in cores busy on average over the window (every "
            "process of each server counted from `/proc`: backends, WAL writer and sender, "
            "startup process replaying the WAL on the replica):",
            "",
            "| readers | primary, primary-only readers | primary, replica readers "
            "| replica, replica readers | primary: replica ÷ primary-only readers |",
            "|--:|--:|--:|--:|--:|",
        ]
        for n in (2, 4):
            a, b = rp[f"primary_only_r{n}"], rp[f"replica_r{n}"]
            lines.append(
                f"| {n} | {a['primary_cores']:.2f} | {b['primary_cores']:.2f} | "
                f"{b['replica_cores']:.2f} | "
                f"{b['primary_cores'] / a['primary_cores']:.2f}× |"
            )
    ryw, served = rp["ryw_ms"], rp["ryw_served"]
    lines += [
        "",
        "Read-your-writes — append one event, then load the head, through one store, the "
        f"three stores taking turns: {ryw['primary_only']:.2f} ms primary-only; "
        f"{ryw['replica']:.2f} ms with the replica ({ryw['replica'] / ryw['primary_only']:.2f}×; "
        f"loads served {served['replica']}): the primary's WAL position, a probe of the "
        "replica, and the wait until it has received, flushed and replayed the append; "
        f"{ryw['replica_wait0']:.2f} ms with `replica_wait=0` "
        f"({ryw['replica_wait0'] / ryw['primary_only']:.2f}×; loads served "
        f"{served['replica_wait0']}): a read the replica cannot serve at once goes to the "
        "primary.",
        "",
        "How to read it: the primary, the replica and every client share this machine's 2 "
        "cores, with other programs running at the same time, so a replica cannot add capacity "
        "here, and reads/s move by tens of percent from run to run (both directions). Read "
        "the throughput rows as what routing costs or saves under contention, not as scaling. "
        "The CPU rows show what does carry over to separate machines: with the readers on "
        "the replica, the reads' server work leaves the primary (part of the drop is the "
        "lower append rate of the same rounds, in the table above; the client CPU, most of "
        "the machine's, is not in these figures); on its own machine each replica brings "
        "its own CPU and cache for that work, and the writers no longer share the primary "
        "with it.",
        "",
    ]
    return "\n".join(lines)


RENDER = {"compare": render_compare, "growth": render_growth, "replicas": render_replicas}


def record(res: dict[str, Any], parts: list[str]) -> str:
    """Write the subsections of ``parts`` into RESULTS.md's ``## Scale`` section; the text.

    All three parts replace the whole section. Fewer replace only their own subsections
    (a part's subsection runs up to the next ``###`` or ``##`` heading), keeping the others
    as they were measured.
    """
    new = {part: RENDER[part](res) for part in parts}
    if len(parts) == len(PARTS):
        text = "\n".join([render_header(res), *new.values()])
        record_section(RESULTS, SECTION, text)
        return text
    results = RESULTS.read_text() if RESULTS.exists() else ""
    section = re.search(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", results, re.S | re.M)
    body = section.group(0) if section else render_header(res)
    # The header names the command and the machine, not a date: the parts carry theirs.
    body = render_header(res) + body[body.index("\n### ") + 1 :] if "\n### " in body else body
    for part, text in new.items():
        sub = re.compile(rf"^{re.escape(PARTS[part])}\n.*?(?=^###? |\Z)", re.S | re.M)
        if sub.search(body):
            body = sub.sub(lambda _: text.rstrip("\n") + "\n\n", body, count=1)
        else:
            body = body.rstrip("\n") + "\n\n" + text
    record_section(RESULTS, SECTION, body)
    return "\n\n".join(new.values())


def main(argv: list[str] | None = None) -> int:
    """Run the parts asked for (all three by default); write ``benchmarks/out/scale.json``
    and RESULTS.md."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks scale", description=(__doc__ or "").split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="smaller sizes, ~2 min")
    ap.add_argument("--fill-seconds", type=float, default=None, help="growth fill per schema")
    ap.add_argument(
        "--part", action="append", choices=list(PARTS), help="run only this part (repeatable)"
    )
    ap.add_argument("--blocks", type=int, default=None, help="blocks of the compare part")
    ap.add_argument("--no-record", action="store_true", help="do not rewrite RESULTS.md")
    args = ap.parse_args(argv)
    admin = os.environ.get("EVENTSTORE_TEST_PG_URL")
    replica = os.environ.get("EVENTSTORE_TEST_PG_REPLICA_URL")
    if not admin or not replica:
        print("run through scripts/with-postgres (it starts the server and its replica)")
        return 2
    quick = args.quick
    parts = [p for p in PARTS if p in (args.part or PARTS)]
    fill = args.fill_seconds or (30.0 if quick else 240.0)
    with psycopg.connect(_dsn(admin)) as conn:
        (server,) = conn.execute("SELECT version()").fetchone()  # type: ignore[misc]
    st = os.statvfs("/tmp")
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(["eventstore", "psycopg", "sqlalchemy"], implementation=True),
        "server": " ".join(server.split()[:2]),
        "disk_free_gb": st.f_bavail * st.f_frsize / 1e9,
        "quick": quick,
        "fill_seconds": fill,
        "parts": parts,
        # The options the figures depend on, as typed (for the "Measured" lines).
        "flags": "".join(
            f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--no-record"
        ),
    }
    if "compare" in parts:
        print("partitioned vs plain", flush=True)
        res["compare"] = compare_partitioned(
            admin,
            sessions=100 if quick else 400,
            blocks=args.blocks or (12 if quick else 40),
        )
        print(f"  {res['compare']}", flush=True)
    if "growth" in parts:
        print("growth", flush=True)
        res["growth"] = grow(admin, counts=(0, PARTITIONS), seconds=fill, checkpoints=4)
    if "replicas" in parts:
        print("replicas", flush=True)
        res["replicas"] = replicas(
            admin, replica, sessions=100 if quick else 300, seconds=4.0 if quick else 8.0,
            rounds=1 if quick else 3,
        )
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(res, indent=2), encoding="utf-8")
    if args.no_record:
        print("\n\n".join(RENDER[part](res) for part in parts))
    else:
        print(record(res, parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
