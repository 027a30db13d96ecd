"""The conversations catalogue: one sidebar page among many sessions, and what keeping the
catalogue costs appends and loads.

Run (PostgreSQL from scripts/with-postgres)::

    scripts/with-postgres .venv/bin/python -m benchmarks catalogue --results benchmarks/RESULTS.md

1. Page: ``list_sessions(owner=..., limit=50)`` (and its next page, and a page of every
   owner's sessions) on PostgreSQL while the sessions table grows to N rows, written
   directly with COPY (owners of ~50 sessions each, one owner with 200). Target: p50
   <= 5 ms, flat from 10k to 1M.
2. Cost: single-event appends (a send, then stream parts) and head loads of the working
   tree against a baseline revision, each run in a subprocess of its own on a fresh
   schema, alternated; the ratio is ours / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks._common import extract_tree, machine, record_section

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTION = "## Catalogue (sidebar pages)"
STEPS = (10_000, 100_000, 1_000_000)
BENCH_OWNER = "user:bench"


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextmanager
def _schema(admin_url: str) -> Iterator[str]:
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_dsn(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in admin_url else "?"
    try:
        yield f"{admin_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(_dsn(admin_url), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _fill(url: str, start: int, stop: int) -> None:
    """Sessions rows ``start..stop-1`` by COPY: owners of ~50 sessions, times shuffled."""
    import psycopg

    zero = b"\x00" * 32
    with psycopg.connect(_dsn(url)) as conn, conn.cursor() as cur:
        with cur.copy(
            "COPY sessions (id, head, head_hash, head_turn, created_at, updated_at, owner, status,"
            " first_text) FROM STDIN"
        ) as copy:
            for i in range(start, stop):
                owner = BENCH_OWNER if i < 200 else f"user:{i // 50}"
                updated = 1_700_000_000_000_000 + (i * 7919) % 1_000_003 * 1000
                copy.write_row((f"c{i}", 0, zero, 0, 1_700_000_000_000_000 + i, updated, owner, "idle", f"chat {i}"))
        conn.execute("ANALYZE sessions")
        conn.commit()


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def pages(admin_url: str, repeats: int, steps: Sequence[int], budget: float) -> list[dict[str, Any]]:
    from eventstore import EventStore

    rows: list[dict[str, Any]] = []
    with _schema(admin_url) as url, EventStore(url) as store:
        store.migrate()
        have, t_start = 0, time.monotonic()
        for n in steps:
            t0 = time.monotonic()
            _fill(url, have, n)
            have = n
            fill_s = time.monotonic() - t0

            def first() -> Any:
                return store.list_sessions(owner=BENCH_OWNER, limit=50)

            cursor = first().next_cursor
            cases = {
                "owner page 1": first,
                "owner page 2": lambda: store.list_sessions(owner=BENCH_OWNER, limit=50, cursor=cursor),
                "owner, created": lambda: store.list_sessions(owner=BENCH_OWNER, order="created", limit=50),
                "all owners": lambda: store.list_sessions(limit=50),
            }
            for name, fn in cases.items():
                for _ in range(20):
                    fn()
                samples = []
                for _ in range(repeats):
                    t = time.perf_counter()
                    page = fn()
                    samples.append((time.perf_counter() - t) * 1000)
                assert len(page.items) == 50
                rows.append(
                    {"n": n, "case": name, "p50_ms": statistics.median(samples), "p95_ms": _pct(samples, 0.95), "fill_s": fill_s}
                )
            print(f"  {n:>9} sessions: owner page p50 {rows[-4]['p50_ms']:.2f} ms (filled in {fill_s:.1f} s)", flush=True)
            if time.monotonic() - t_start > budget:
                break
    return rows


# The cost side: the same program against either tree (run in a subprocess).
_COST = r"""
import json, sys, time
from eventstore import EventStore
url, n = sys.argv[1], int(sys.argv[2])
with EventStore(url) as store:
    store.migrate()
    for s in range(20):
        store.append(f"w{s}", [{"type": "send", "id": "u", "text": "warm up"}])
    t = time.perf_counter()
    for i in range(n):
        s = f"s{i % 20}"
        if i < 20:
            store.append(s, [{"type": "send", "id": f"u{i}", "text": "hello there"}])
        else:
            store.append(s, [{"type": "part", "part": {"type": "text-delta", "messageId": "m", "text": "tok "}}])
    append_us = (time.perf_counter() - t) / n * 1e6
    for _ in range(50):
        store.load("s0")
    t = time.perf_counter()
    for _ in range(500):
        store.load("s0")
    load_us = (time.perf_counter() - t) / 500 * 1e6
print(json.dumps({"append_us": append_us, "load_us": load_us}))
"""


def _cost_once(tree: Path, admin_url: str, n: int) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{tree}{os.pathsep}{tree / 'cli'}"
    with _schema(admin_url) as url:
        r = subprocess.run([sys.executable, "-c", _COST, url, str(n)], env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def cost(admin_url: str, baseline: str, rounds: int, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="es-catalogue-") as tmp:
        base_tree = extract_tree(ROOT, baseline, Path(tmp))
        runs: dict[str, list[dict[str, float]]] = {"baseline": [], "ours": []}
        for _ in range(rounds):
            runs["baseline"].append(_cost_once(base_tree, admin_url, n))
            runs["ours"].append(_cost_once(ROOT, admin_url, n))
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("append_us", "load_us")} for k, v in runs.items()}
    return {
        "baseline": baseline,
        "appends": n,
        "median": med,
        "ratio": {m: med["ours"][m] / med["baseline"][m] for m in ("append_us", "load_us")},
    }


def markdown(result: dict[str, Any], argv: Sequence[str]) -> str:
    m = result["machine"]
    lines = [
        SECTION,
        "",
        f"`python -m benchmarks catalogue {' '.join(argv)}`".replace(" `", "`"),
        f"on {m['uname']} ({m['nproc']} CPUs, shared), Python {m['python']}, {result['date']}; "
        "PostgreSQL from scripts/with-postgres (fsync on).",
        "",
        "One page of `list_sessions` (milliseconds, through the library; sessions rows written by COPY,",
        f"owners of ~50 sessions, `{BENCH_OWNER}` with 200):",
        "",
        "| sessions | case | p50 ms | p95 ms |",
        "|---:|---|---:|---:|",
    ]
    for r in result["pages"]:
        lines.append(f"| {r['n']:,} | {r['case']} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} |")
    reached = max(r["n"] for r in result["pages"])
    lines += ["", f"N reached: {reached:,}."]
    c = result.get("cost")
    if c:
        lines += [
            "",
            f"What keeping the catalogue costs (PostgreSQL; {c['appends']} single-event appends over 20 sessions,",
            f"then 500 head loads; each tree in its own process, median of rounds; baseline `{c['baseline']}`):",
            "",
            "| | baseline | with the catalogue | ratio |",
            "|---|---:|---:|---:|",
        ]
        for key, label in (("append_us", "append µs/event"), ("load_us", "load head µs")):
            lines.append(
                f"| {label} | {c['median']['baseline'][key]:.0f} | {c['median']['ours'][key]:.0f} | {c['ratio'][key]:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the markdown section, optionally record it; 0 when the page target is met."""
    args = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks catalogue", description=__doc__.split("\n\n")[0])
    p.add_argument("--pg-url", default=os.environ.get("EVENTSTORE_TEST_PG_URL"))
    p.add_argument("--repeats", type=int, default=200, help="timed pages per case and size")
    p.add_argument("--max-sessions", type=int, default=STEPS[-1])
    p.add_argument("--budget", type=float, default=300.0, help="stop growing after this many seconds")
    p.add_argument("--baseline", default="main", help="git revision the cost side compares with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--appends", type=int, default=2000)
    p.add_argument("--no-cost", action="store_true", help="only the page side")
    p.add_argument("--results", type=Path, default=None, help="also record the section in this RESULTS.md")
    ns = p.parse_args(args)
    if not ns.pg_url:
        print("PostgreSQL needs --pg-url or EVENTSTORE_TEST_PG_URL (run under scripts/with-postgres)", file=sys.stderr)
        return 2
    steps = [n for n in STEPS if n <= ns.max_sessions] or [ns.max_sessions]
    result: dict[str, Any] = {
        "machine": machine(["sqlalchemy", "psycopg"]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "pages": pages(ns.pg_url, ns.repeats, steps, ns.budget),
    }
    if not ns.no_cost:
        result["cost"] = cost(ns.pg_url, ns.baseline, ns.rounds, ns.appends)
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "catalogue.json").write_text(json.dumps(result, indent=2))
    section = markdown(result, args)
    print(section)
    if ns.results is not None:
        record_section(ns.results, SECTION, section)
    first = [r["p50_ms"] for r in result["pages"] if r["case"] == "owner page 1"]
    return 0 if max(first) <= 5.0 else 1
