"""Rewind benchmark: rewinding a 100,000-event session costs what rewinding a 100-event one does.

Run::

    .venv/bin/python -m benchmarks rewind                        # SQLite (+ PostgreSQL if available)
    .venv/bin/python -m benchmarks rewind --results benchmarks/RESULTS.md
    scripts/with-postgres .venv/bin/python -m benchmarks rewind  # both backends

PostgreSQL is measured when ``--pg URL`` or ``EVENTSTORE_TEST_PG_URL`` names a server; each
run uses a fresh schema and drops it.

Workload: ``eventstore.samples.chat_session`` events, 100 in one session and 100,000 (or
``--events``) in another, appended in batches of 1,000. Each timed run is one
``store.rewind(session, to=head - 1)`` (a new kept line each time), the two sizes measured
alternately so that load from other processes affects both alike; median and best of
``--repeats`` runs after a warm-up. Target: big ÷ small ≤ 1.5 (no event is read, copied
or written: the cost is the session's row, the new row and the record).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import machine as _machine
from benchmarks._common import record_section
from benchmarks.timetravel import _actions, _fill, _pg_url, _sqlite_url
from eventstore import EventStore

__all__ = ["main", "measure_backend"]

SECTION = "## Rewind (O(1) in the session's length)"
OUT = Path(__file__).parent / "out" / "rewind.json"
MAX_RATIO = 1.5
SMALL = 100


def _alternately(fns: Sequence[Callable[[], Any]], repeats: int, warmup: int = 2) -> list[dict[str, float]]:
    for _ in range(warmup):
        for fn in fns:
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, acc in zip(fns, samples, strict=True):
            gc.collect()
            t0 = time.perf_counter_ns()
            fn()
            acc.append((time.perf_counter_ns() - t0) / 1e9)
    return [{"median": statistics.median(s), "best": min(s)} for s in samples]


def measure_backend(url: str, big: int, repeats: int, seed: int = 0) -> dict[str, Any]:
    """The rewind figures for one database URL."""
    with EventStore(url) as store:
        store.migrate()
        _fill(store, "small", _actions(SMALL, seed))
        fill = _fill(store, "big", _actions(big, seed))

        def rewind(session: str) -> Callable[[], None]:
            def run() -> None:
                kept = store.rewind(session, to=store.head(session) - 1, reason="bench")
                assert kept is not None

            return run

        small, large = _alternately([rewind("small"), rewind("big")], repeats)
        assert store.verify("big").ok
    return {
        "events": {"small": SMALL, "big": big},
        "fill_seconds": fill,
        "rewind": {"small": small, "big": large, "ratio": large["median"] / small["median"]},
    }


def _markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        SECTION,
        "",
        f"{results['date']} · `{m['uname']}` · {m['nproc']} CPUs · Python {m['python']} · "
        f"`python -m benchmarks rewind --repeats {results['repeats']}`",
        "",
        "| backend | rewind, 100 events | rewind, {:,} events | ratio (target ≤ {}) |".format(
            next(iter(results["backends"].values()))["events"]["big"], MAX_RATIO
        ),
        "|---|---|---|---|",
    ]
    for name, r in results["backends"].items():
        rw = r["rewind"]
        lines.append(
            f"| {name} | {rw['small']['median'] * 1e3:.2f} ms (best {rw['small']['best'] * 1e3:.2f}) "
            f"| {rw['big']['median'] * 1e3:.2f} ms (best {rw['big']['best'] * 1e3:.2f}) | {rw['ratio']:.2f} |"
        )
    lines += [
        "",
        "Each run is `store.rewind(session, to=head - 1)`, the two sizes timed alternately; "
        "the median of the runs. A rewind renames the session's row, inserts the row that "
        "takes its id and the audit record: no event is read or written.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks rewind", description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000, help="events in the big session")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--pg", default=os.environ.get("EVENTSTORE_TEST_PG_URL"), help="PostgreSQL admin URL")
    ap.add_argument("--results", type=Path, help="record the markdown section in this RESULTS.md")
    args = ap.parse_args(argv)
    if args.repeats + 2 >= SMALL:
        ap.error(f"--repeats must stay below {SMALL - 2} (each run rewinds one version)")
    backends: dict[str, Any] = {}
    with _sqlite_url() as url:
        backends["sqlite"] = measure_backend(url, args.events, args.repeats)
    if args.pg:
        with _pg_url(args.pg) as url:
            backends["postgresql"] = measure_backend(url, args.events, args.repeats)
    results = {
        "date": dt.date.today().isoformat(),
        "machine": _machine(["sqlalchemy", "psycopg"]),
        "repeats": args.repeats,
        "backends": backends,
    }
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))
    md = _markdown(results)
    sys.stdout.write(md)
    if args.results:
        record_section(args.results, SECTION, md)
    worst = max(r["rewind"]["ratio"] for r in backends.values())
    return 0 if worst <= MAX_RATIO else 1
