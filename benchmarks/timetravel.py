"""Time-travel benchmark: branch, diff and compact on long sessions.

Run::

    .venv/bin/python -m benchmarks timetravel                       # SQLite (+ PostgreSQL if available)
    .venv/bin/python -m benchmarks timetravel --quick               # 10k instead of 100k events
    .venv/bin/python -m benchmarks timetravel --results benchmarks/RESULTS.md
    scripts/with-postgres .venv/bin/python -m benchmarks timetravel # both backends

PostgreSQL is measured when ``--pg URL`` or ``EVENTSTORE_TEST_PG_URL`` (set by
``scripts/with-postgres``) names a server; each run uses a fresh schema and drops it.

Workload: ``eventstore.samples.chat_session`` (≈ 86 events per turn), appended in batches
of 1,000 events. Figures are the median (and best) of ``--repeats`` timed runs after a
warm-up (the two branch sizes are measured alternately, so that load from other processes
affects both alike):

- **branch**: ``store.branch(session, at=head // 2)`` on a 1k- and a 100k-event session.
  Target: 100k ÷ 1k ≤ 1.5 (copy-on-write: no event is copied, so the cost is constant).
- **diff**: ``store.diff`` between the head of the 100k-event session and the head of a
  branch forked ``k`` events back (k = 10 … 10,000), the branch carrying 50 events of its
  own. The cost is two checkouts (a snapshot plus at most ``snapshot_every`` events each)
  plus the message comparison — it must not grow with ``k``.
- **compact**: ``store.compact(session, upto=head - 100)`` on a fresh 100k-event session:
  events removed per second (the baseline snapshot is written in the same transaction).
- **export / import**: the 100k-event session to JSON Lines in memory, then into an empty
  database of the same backend (the whole file parsed, validated and hash-checked first).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import io
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from benchmarks._common import machine as _machine
from benchmarks._common import record_section, timed
from eventstore import EventStore
from eventstore.samples import chat_session

__all__ = ["main", "measure"]

SECTION = "## Time travel (branch, diff, compact)"
OUT = Path(__file__).parent / "out" / "timetravel.json"
MAX_BRANCH_RATIO = 1.5
BATCH = 1_000


def _time(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> dict[str, float]:
    return timed(fn, repeats, warmup)


def _time_pair(
    f: Callable[[], Any], g: Callable[[], Any], repeats: int, warmup: int = 2
) -> tuple[dict[str, float], dict[str, float]]:
    """Like :func:`_time` for two functions measured alternately."""
    for _ in range(warmup):
        f()
        g()
    fs, gs = [], []
    for _ in range(repeats):
        for fn, acc in ((f, fs), (g, gs)):
            gc.collect()
            t0 = time.perf_counter_ns()
            fn()
            acc.append((time.perf_counter_ns() - t0) / 1e9)
    return (
        {"median": statistics.median(fs), "best": min(fs)},
        {"median": statistics.median(gs), "best": min(gs)},
    )


def _actions(n: int, seed: int) -> list[dict[str, Any]]:
    turns = n // 80 + 2
    acts = chat_session(turns, seed=seed)[:n]
    assert len(acts) == n
    return acts


def _fill(store: EventStore, session: str, actions: list[dict[str, Any]]) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(actions), BATCH):
        store.append(session, actions[i : i + BATCH])
    return time.perf_counter() - t0


@contextmanager
def _sqlite_url() -> Iterator[str]:
    with TemporaryDirectory(prefix="es-bench-") as d:
        yield f"sqlite:///{Path(d) / 'bench.db'}"


@contextmanager
def _pg_url(admin: str) -> Iterator[str]:
    import psycopg

    dsn = admin.replace("postgresql+psycopg://", "postgresql://", 1)
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in admin else "?"
    try:
        yield f"{admin}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def measure_backend(
    url: str, big: int, repeats: int, fresh: Callable[[], Any], seed: int = 0
) -> dict[str, Any]:
    """All figures for one database URL; ``fresh()`` gives another empty database's URL."""
    out: dict[str, Any] = {"events": big}
    with EventStore(url) as store:
        store.migrate()
        small_actions = _actions(1_000, seed)
        big_actions = _actions(big, seed)
        _fill(store, "small", small_actions)
        out["fill_seconds"] = _fill(store, "big", big_actions)

        counter = iter(range(10**9))

        def branch(session: str, head: int) -> Callable[[], None]:
            return lambda: store.branch(session, at=head // 2, new_id=f"{session}-b{next(counter)}")

        # Interleaved, so that load from other processes hits both sizes alike.
        b_small, b_big = _time_pair(branch("small", 1_000), branch("big", big), repeats * 2)
        out["branch"] = {
            "1k": b_small,
            "big": b_big,
            "ratio": b_big["median"] / b_small["median"],
        }

        own = _actions(50, seed + 1)
        diffs = []
        for k in (10, 100, 1_000, 10_000):
            if k >= big:
                continue
            name = f"fork-{k}"
            store.branch("big", at=big - k, new_id=name)
            store.append(name, own)
            t = _time(lambda n=name: store.diff(("big", None), (n, None)), repeats)
            d = store.diff(("big", None), (name, None))
            diffs.append(
                {
                    "since_fork": k,
                    "events_left": d.events_left,
                    "events_right": d.events_right,
                    "changed_messages": len(d.added) + len(d.removed) + len(d.changed),
                    **t,
                }
            )
        out["diff"] = diffs
        out["load_head"] = _time(lambda: store.load("big"), repeats)

        buf = io.StringIO()
        t0 = time.perf_counter()
        n_exported = store.export("big", buf)
        t_export = time.perf_counter() - t0
        with fresh() as other_url, EventStore(other_url) as other:
            other.migrate()
            buf.seek(0)
            t0 = time.perf_counter()
            other.import_(buf)
            t_import = time.perf_counter() - t0
            assert other.verify("big").ok
        out["export_import"] = {
            "events": n_exported,
            "bytes": len(buf.getvalue().encode()),
            "export_seconds": t_export,
            "import_seconds": t_import,
        }

        _fill(store, "victim", big_actions)
        upto = big - 100
        t0 = time.perf_counter()
        r = store.compact("victim", upto=upto)
        secs = time.perf_counter() - t0
        out["compact"] = {
            "removed": r.removed,
            "seconds": secs,
            "events_per_second": r.removed / secs if secs else float("inf"),
        }
        assert store.verify("victim").ok
    return out


def machine() -> dict[str, Any]:
    return _machine(("eventstore", "sqlalchemy", "psycopg", "orjson"))


def measure(big: int, repeats: int, pg: str | None) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "backends": {},
    }
    with _sqlite_url() as url:
        results["backends"]["sqlite"] = measure_backend(url, big, repeats, _sqlite_url)
    if pg:
        with _pg_url(pg) as url:
            results["backends"]["postgresql"] = measure_backend(
                url, big, repeats, lambda: _pg_url(pg)
            )
    return results


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


def render(r: dict[str, Any], command: str) -> str:
    m = r["machine"]
    lines = [
        SECTION,
        "",
        f"Measured {r['date']} with `{command}` on {m['uname']} ({m['nproc']} CPUs), "
        f"Python {m['python']}, "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items())
        + ". Median (best) of the timed runs after a warm-up; workload `chat_session`, "
        "appended in batches of 1,000 events.",
        "",
    ]
    for name, b in r["backends"].items():
        n = b["events"]
        br = b["branch"]
        ok = "✅" if br["ratio"] <= MAX_BRANCH_RATIO else "❌"
        lines += [
            f"### {name} ({n:,} events; filled in {b['fill_seconds']:.1f} s)",
            "",
            "| figure | value |",
            "|---|---|",
            f"| branch at 1k events | {_ms(br['1k']['median'])} ({_ms(br['1k']['best'])}) |",
            f"| branch at {n // 1000}k events | {_ms(br['big']['median'])} ({_ms(br['big']['best'])}) |",
            f"| branch ratio {n // 1000}k ÷ 1k (target ≤ {MAX_BRANCH_RATIO}) | {br['ratio']:.2f} {ok} |",
            f"| load head of the {n // 1000}k session (for scale) | {_ms(b['load_head']['median'])} |",
            f"| export {b['export_import']['events']:,} events "
            f"({b['export_import']['bytes'] / 1e6:.1f} MB JSON Lines) | "
            f"{b['export_import']['export_seconds']:.2f} s = "
            f"{b['export_import']['events'] / b['export_import']['export_seconds']:,.0f} events/s |",
            f"| import them into an empty database (hash chain checked, snapshots written) | "
            f"{b['export_import']['import_seconds']:.2f} s = "
            f"{b['export_import']['events'] / b['export_import']['import_seconds']:,.0f} events/s |",
            f"| compact {b['compact']['removed']:,} events | {b['compact']['seconds']:.2f} s = "
            f"{b['compact']['events_per_second']:,.0f} events/s |",
            "",
            f"diff of the {n // 1000}k session's head against a branch forked k events back "
            "(the branch has 50 events of its own):",
            "",
            "| events since fork (k) | left / right events | messages differing | diff |",
            "|---:|---:|---:|---:|",
        ]
        for d in b["diff"]:
            lines.append(
                f"| {d['since_fork']:,} | {d['events_left']:,} / {d['events_right']} | "
                f"{d['changed_messages']} | {_ms(d['median'])} ({_ms(d['best'])}) |"
            )
        lines.append("")
    lines += [
        "Reading: a branch writes one session row (the parent's hash and turn at the fork are "
        "read from one event), so its cost does not depend on the session's length. A diff "
        "walks the two lineages (session rows only), loads both heads (a snapshot plus at most "
        "`snapshot_every` events each) and compares their messages; it reads none of the events "
        "since the fork, so its cost tracks the size of the states, not k. Compaction writes the "
        "baseline snapshot and deletes the prefix in one transaction.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks timetravel", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="10k events instead of 100k")
    p.add_argument("--events", type=int, default=None, help="events of the long session")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--pg", default=os.environ.get("EVENTSTORE_TEST_PG_URL"), help="PostgreSQL admin URL")
    p.add_argument("--no-pg", action="store_true", help="SQLite only")
    p.add_argument("--results", type=Path, default=None, help="also record the section in this RESULTS.md")
    a = p.parse_args(list(argv or []))
    big = a.events or (10_000 if a.quick else 100_000)
    r = measure(big, a.repeats, None if a.no_pg else a.pg)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(r, indent=2), encoding="utf-8")
    command = "python -m benchmarks timetravel " + " ".join(argv or [])
    section = render(r, command.strip())
    print(section)
    if a.results is not None:
        record_section(a.results, SECTION, section)
    worst = max(b["branch"]["ratio"] for b in r["backends"].values())
    return 0 if worst <= MAX_BRANCH_RATIO else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
