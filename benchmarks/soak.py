"""Soak: writer processes × sessions with concurrent readers for a fixed time, then an audit.

Run::

    .venv/bin/python -m benchmarks soak                                  # SQLite, 10 s
    scripts/with-postgres .venv/bin/python -m benchmarks soak --seconds 60 --backend both \\
        --results benchmarks/RESULTS.md
    scripts/with-postgres .venv/bin/python -m benchmarks soak --backend postgresql --terminate-every 0.5

Workload: ``--writers`` processes, each owning ``--sessions`` sessions, append batches of
1–5 actions (``samples.random_actions``) round-robin to their sessions, every batch with
fresh ``event_ids`` and the expected version; a ``StorageError(retryable=True)`` (a busy
SQLite file, a terminated PostgreSQL connection) is retried with the *same* ids until
acknowledged. ``--readers`` processes meanwhile check out random versions of random sessions
(``head`` then ``load(version=v)``) and record a digest of each state.
``--terminate-every S`` (PostgreSQL) also kills every soak connection each S seconds.

Audit after the run (all must hold, else the exit code is 1):

- **no lost and no duplicated event**: each session's log is exactly the acknowledged event
  ids in acknowledgement order, versions ``1..head`` contiguous;
- **every read was a fold of a prefix**: each digest a reader recorded equals the digest of
  the fold of the first ``v`` events of the final log;
- ``verify()`` is ok for every session; on SQLite ``PRAGMA integrity_check`` is ``ok``.

Reported: appended events/s and appends/s, p50/p99/max latency of an acknowledged append
(including its retries), retries, checkouts/s with their p50/p99. Results go to
``benchmarks/out/soak.json`` and, with ``--results``, to the "## Soak (reliability)"
section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import multiprocessing as mp
import os
import random
import re
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import orjson

from benchmarks._common import machine
from eventstore.errors import SessionNotFound, StorageError
from eventstore.core.reducer import fold
from eventstore.samples import random_actions
from eventstore import EventStore

__all__ = ["main", "soak"]

SECTION = "## Soak (reliability)"
OUT = Path(__file__).parent / "out" / "soak.json"
TAG = "eventstore-soak"


def _digest(state_json: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(state_json, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


# --------------------------------------------------------------------------- workers


def _start(store: EventStore, ready: Any, go: Any, until: Any) -> float:
    """Connect, say so, and wait until every process is ready: the clock starts together."""
    store.sessions()
    ready.put(1)
    go.wait()
    return float(until.value)


def _writer(url: str, me: int, sessions: int, sync: tuple[Any, Any, Any], seed: int, out: Any) -> None:
    rng = random.Random(seed * 1000 + me)
    store = EventStore(url, snapshot_every=32)
    until = _start(store, *sync)
    names = [f"w{me}-s{j}" for j in range(sessions)]
    heads = dict.fromkeys(names, 0)
    acked: dict[str, list[str]] = {n: [] for n in names}
    latencies: list[float] = []
    retries = 0
    errors: list[str] = []
    i = 0
    while time.time() < until:
        name = names[i % sessions]
        n = rng.randint(1, 5)
        actions = random_actions(rng, n)
        ids = [f"{name}-{i}-{k}" for k in range(n)]
        started = time.perf_counter()
        while True:
            try:
                r = store.append(name, actions, expected_version=heads[name], event_ids=ids)
                break
            except StorageError as exc:
                if not exc.retryable or time.time() > until + 60:
                    errors.append(str(exc))
                    r = None
                    break
                retries += 1
                time.sleep(0.005)
            except Exception as exc:  # noqa: BLE001 - reported in the audit
                errors.append(f"{type(exc).__name__}: {exc}")
                r = None
                break
        if r is None:
            break
        latencies.append(time.perf_counter() - started)
        heads[name] = r.version
        acked[name] += ids
        i += 1
    store.close()
    out.put({"kind": "writer", "acked": acked, "latencies": latencies, "retries": retries, "errors": errors})


def _reader(url: str, me: int, sessions: list[str], sync: tuple[Any, Any, Any], seed: int, out: Any) -> None:
    rng = random.Random(seed * 7919 + me)
    store = EventStore(url, snapshot_every=32)
    until = _start(store, *sync)
    reads: list[tuple[str, int, str]] = []
    latencies: list[float] = []
    retries = 0
    errors: list[str] = []
    while time.time() < until:
        name = rng.choice(sessions)
        started = time.perf_counter()
        try:
            head = store.head(name)
            v = rng.randint(0, head)
            state = store.load(name, version=v).to_json()
        except SessionNotFound:
            continue  # not written yet
        except StorageError as exc:
            if not exc.retryable:
                errors.append(str(exc))
                break
            retries += 1
            continue
        except Exception as exc:  # noqa: BLE001 - reported in the audit
            errors.append(f"{type(exc).__name__}: {exc}")
            break
        latencies.append(time.perf_counter() - started)
        reads.append((name, v, _digest(state)))
    store.close()
    out.put({"kind": "reader", "reads": reads, "latencies": latencies, "retries": retries, "errors": errors})


def _terminator(admin_url: str, every: float, until: float, counter: list[int]) -> None:
    import psycopg

    with psycopg.connect(admin_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        while time.time() < until:
            time.sleep(every)
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (TAG,),
            ).fetchone()
            counter[0] += int(row[0]) if row else 0


# --------------------------------------------------------------------------- one run


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def soak(
    url: str,
    backend: str,
    *,
    seconds: float,
    writers: int,
    sessions: int,
    readers: int,
    seed: int,
    terminate_every: float | None = None,
    admin_url: str | None = None,
) -> dict[str, Any]:
    """Run the workload against ``url`` (migrated here) and audit the result."""
    with EventStore(url) as store:
        store.migrate()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    names = [f"w{w}-s{j}" for w in range(writers) for j in range(sessions)]
    ready, go, until_v = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    sync = (ready, go, until_v)
    procs = [ctx.Process(target=_writer, args=(url, w, sessions, sync, seed, out)) for w in range(writers)]
    procs += [ctx.Process(target=_reader, args=(url, r, names, sync, seed, out)) for r in range(readers)]
    for p in procs:
        p.start()
    for _ in procs:  # every process imported, opened its store and connected
        ready.get(timeout=300)
    start = time.time()
    until = start + seconds
    until_v.value = until
    go.set()
    killed = [0]
    chaos = None
    if terminate_every and admin_url:
        chaos = threading.Thread(target=_terminator, args=(admin_url, terminate_every, until, killed))
        chaos.start()
    results = [out.get(timeout=seconds + 300) for _ in procs]
    for p in procs:
        p.join(60)
    if chaos is not None:
        chaos.join(60)
    elapsed = seconds

    w_res = [r for r in results if r["kind"] == "writer"]
    r_res = [r for r in results if r["kind"] == "reader"]
    acked: dict[str, list[str]] = {}
    for r in w_res:
        acked.update(r["acked"])
    latencies = [x for r in w_res for x in r["latencies"]]
    read_lat = [x for r in r_res for x in r["latencies"]]
    reads = [tuple(x) for r in r_res for x in r["reads"]]
    errors = [e for r in results for e in r["errors"]]

    # ---- audit
    lost = duplicated = out_of_order = 0
    mismatched = 0
    verify_ok = True
    wanted: dict[str, set[int]] = {}
    for name, v, _ in reads:
        wanted.setdefault(name, set()).add(v)
    digests: dict[tuple[str, int], str] = {}
    with EventStore(url) as store:
        for name in names:
            ids = acked.get(name, [])
            try:
                events = list(store.history(name))
            except SessionNotFound:
                events = []
            got = [e.event_id for e in events]
            lost += len(set(ids) - set(got))
            duplicated += len(got) - len(set(got)) + len(set(got) - set(ids))
            if got != ids or [e.version for e in events] != list(range(1, len(events) + 1)):
                out_of_order += 1
            if events and not store.verify(name).ok:
                verify_ok = False
            # Digests of the fold of every prefix a reader asked for.
            state = fold([])
            done = 0
            for v in sorted(wanted.get(name, ())):
                if v > len(events):
                    continue
                state = fold([e.action for e in events[done:v]], state)
                done = v
                digests[(name, v)] = _digest(state.to_json())
    for name, v, d in reads:
        if digests.get((name, v)) != d:
            mismatched += 1
    integrity = "-"
    if backend == "sqlite":
        con = sqlite3.connect(url.removeprefix("sqlite:///"))
        integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
        con.close()
    events_total = sum(len(v) for v in acked.values())
    return {
        "backend": backend,
        "seconds": round(elapsed, 1),
        "writers": writers,
        "sessions_per_writer": sessions,
        "readers": readers,
        "appends": len(latencies),
        "events": events_total,
        "events_per_s": round(events_total / elapsed, 1),
        "appends_per_s": round(len(latencies) / elapsed, 1),
        "append_p50_ms": round(_pct(latencies, 0.5) * 1000, 2),
        "append_p99_ms": round(_pct(latencies, 0.99) * 1000, 2),
        "append_max_ms": round(max(latencies, default=float("nan")) * 1000, 2),
        "append_retries": sum(r["retries"] for r in w_res),
        "reads": len(reads),
        "reads_per_s": round(len(reads) / elapsed, 1),
        "read_p50_ms": round(_pct(read_lat, 0.5) * 1000, 2),
        "read_p99_ms": round(_pct(read_lat, 0.99) * 1000, 2),
        "read_retries": sum(r["retries"] for r in r_res),
        "connections_terminated": killed[0],
        "lost": lost,
        "duplicated": duplicated,
        "read_mismatches": mismatched,
        "out_of_order_sessions": out_of_order,
        "verify_ok": verify_ok,
        "integrity_check": integrity,
        "errors": errors[:10],
        "ok": lost == 0 and duplicated == 0 and mismatched == 0 and out_of_order == 0 and verify_ok
        and not errors and integrity in ("ok", "-"),
    }


# --------------------------------------------------------------------------- databases


@contextmanager
def _sqlite_url() -> Iterator[str]:
    with TemporaryDirectory(prefix="eventstore-soak-") as d:
        yield f"sqlite:///{Path(d) / 'soak.db'}"


@contextmanager
def _pg_url(admin: str) -> Iterator[str]:
    import psycopg

    schema = f"soak_{uuid.uuid4().hex[:12]}"
    dsn = admin.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in admin else "?"
    try:
        yield f"{admin}{sep}options=-csearch_path%3D{schema}&application_name={TAG}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


# --------------------------------------------------------------------------- report


def _machine() -> dict[str, Any]:
    return machine(("eventstore", "sqlalchemy", "psycopg", "orjson"))


ROWS = [
    ("duration (s)", "seconds"),
    ("writer processes × sessions each", None),
    ("reader processes", "readers"),
    ("connections terminated during the run", "connections_terminated"),
    ("acknowledged appends / events", None),
    ("throughput: events/s (appends/s)", None),
    ("append latency p50 / p99 / max (ms)", None),
    ("append retries (retryable errors)", "append_retries"),
    ("checkouts (per s), p50 / p99 (ms)", None),
    ("**lost / duplicated events**", None),
    ("**reads not equal to a fold of a prefix**", "read_mismatches"),
    ("verify() / integrity_check", None),
]


def _cell(r: dict[str, Any], label: str, key: str | None) -> str:
    if key is not None:
        return str(r[key])
    return {
        "writer processes × sessions each": f"{r['writers']} × {r['sessions_per_writer']}",
        "acknowledged appends / events": f"{r['appends']:,} / {r['events']:,}",
        "throughput: events/s (appends/s)": f"{r['events_per_s']:,} ({r['appends_per_s']:,})",
        "append latency p50 / p99 / max (ms)": f"{r['append_p50_ms']} / {r['append_p99_ms']} / {r['append_max_ms']}",
        "checkouts (per s), p50 / p99 (ms)": f"{r['reads']:,} ({r['reads_per_s']}), {r['read_p50_ms']} / {r['read_p99_ms']}",
        "**lost / duplicated events**": f"**{r['lost']} / {r['duplicated']}**",
        "verify() / integrity_check": f"{'ok' if r['verify_ok'] else 'FAILED'} / {r['integrity_check']}",
    }[label]


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    runs = doc["runs"]
    lines = [
        SECTION,
        "",
        f"Measured {doc['date']} with `{doc['command']}` on {m['uname']} ({m['nproc']} CPUs), "
        f"Python {m['python']}, "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items())
        + ". PostgreSQL with default durability (fsync on); SQLite in WAL mode, "
        "busy timeout 30 s. Writers retry retryable errors with the same `event_ids`; the audit "
        "after the run compares every session's log with the acknowledged ids and every "
        "checkout with the fold of the final log's prefix.",
        "",
        "| figure | " + " | ".join(r["label"] for r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for label, key in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(r, label, key) for r in runs) + " |")
    lines.append("")
    verdict = "all runs passed the audit" if all(r["ok"] for r in runs) else "**AUDIT FAILED**"
    lines.append(f"Result: {verdict}.")
    return "\n".join(lines) + "\n"


def _write_results(path: Path, section: str) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks soak", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each run (default 10)")
    parser.add_argument("--writers", type=int, default=4, help="writer processes (default 4)")
    parser.add_argument("--sessions", type=int, default=4, help="sessions per writer (default 4)")
    parser.add_argument("--readers", type=int, default=2, help="reader processes (default 2)")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default=None,
                        help="default: both when a PostgreSQL URL is known, else sqlite")
    parser.add_argument("--pg", default=os.environ.get("EVENTSTORE_TEST_PG_URL"),
                        help="PostgreSQL admin URL (default: $EVENTSTORE_TEST_PG_URL)")
    parser.add_argument("--terminate-every", type=float, default=None,
                        help="PostgreSQL: terminate every soak connection each this many seconds")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--results", type=Path, default=None, help="update this RESULTS.md section")
    args = parser.parse_args(list(argv) if argv is not None else None)
    backend = args.backend or ("both" if args.pg else "sqlite")
    if backend in ("postgresql", "both") and not args.pg:
        parser.error("PostgreSQL needs --pg URL or EVENTSTORE_TEST_PG_URL (scripts/with-postgres)")
    common = dict(seconds=args.seconds, writers=args.writers, sessions=args.sessions,
                  readers=args.readers, seed=args.seed)
    runs = []
    if backend in ("sqlite", "both"):
        with _sqlite_url() as url:
            r = soak(url, "sqlite", **common)
        r["label"] = "sqlite"
        runs.append(r)
    if backend in ("postgresql", "both"):
        with _pg_url(args.pg) as url:
            r = soak(url, "postgresql", **common)
        r["label"] = "postgresql"
        runs.append(r)
        if args.terminate_every:
            with _pg_url(args.pg) as url:
                r = soak(url, "postgresql", terminate_every=args.terminate_every, admin_url=args.pg, **common)
            r["label"] = f"postgresql, connections killed every {args.terminate_every:g} s"
            runs.append(r)
    command = "python -m benchmarks soak " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command.strip(),
        "machine": _machine(),
        "runs": runs,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    print(render(doc))
    if args.results:
        _write_results(args.results, render(doc))
    for r in runs:
        if not r["ok"]:
            print(f"AUDIT FAILED ({r['label']}): {json.dumps({k: r[k] for k in ('lost', 'duplicated', 'read_mismatches', 'verify_ok', 'integrity_check', 'errors')})}",
                  file=sys.stderr)
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
