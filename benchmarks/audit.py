"""Audit benchmark: what the SQLite insert triggers of revision 0002 cost an append.

Run::

    .venv/bin/python -m benchmarks audit              # ~1 min
    .venv/bin/python -m benchmarks audit --quick      # ~15 s
    ... --no-record      # do not rewrite the "## Audit" section of benchmarks/RESULTS.md

Two SQLite files (WAL), both migrated to the newest revision; on the *baseline* file the two
triggers that refuse ``INSERT OR REPLACE`` of an event are dropped again. Ours and the
baseline append the same blocks alternately (who goes first alternates too), each on its own
growing session, and a ratio is the median over blocks of baseline time ÷ our time (1.0: no
cost). Time is this process's CPU time: the triggers cost CPU only, and on a shared machine
wall time (fsync waits, other tenants) drowns a difference of a few percent. Workload: ``eventstore.samples.chat_session``, one event per transaction and one turn
(≈ 86 events) per transaction.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from benchmarks._common import machine
from eventstore.samples import chat_session
from eventstore.storage.sqlite import DROP_AUDIT_DDL_V2
from eventstore import EventStore

__all__ = ["main"]

SECTION = "## Audit"
OUT = Path(__file__).parent / "out" / "audit.json"
RESULTS = Path(__file__).parent / "RESULTS.md"


def _store(path: Path, *, triggers: bool) -> EventStore:
    url = f"sqlite:///{path}"
    store = EventStore(url)
    store.migrate()
    if not triggers:
        engine = create_engine(url)
        with engine.begin() as conn:
            for statement in DROP_AUDIT_DDL_V2:
                conn.execute(text(statement))
        engine.dispose()
    return store


def _block(store: EventStore, session: str, batches: Sequence[list[dict[str, Any]]]) -> float:
    t0 = time.process_time()
    for batch in batches:
        store.append(session, batch)
    return time.process_time() - t0


def _ratio(ours: EventStore, base: EventStore, blocks: list[Sequence[list[dict[str, Any]]]]) -> float:
    ratios = []
    for i, batches in enumerate(blocks):
        pair = [(ours, "ours"), (base, "base")]
        times: dict[str, float] = {}
        for store, who in pair if i % 2 == 0 else pair[::-1]:
            times[who] = _block(store, f"s-{len(batches[0])}", batches)
        ratios.append(times["base"] / times["ours"])
    return statistics.median(ratios)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the ratios; record them in RESULTS.md unless ``--no-record``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks audit", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer blocks (~15 s)")
    parser.add_argument("--no-record", action="store_true", help="leave RESULTS.md alone")
    args = parser.parse_args(argv)
    n_blocks = 6 if args.quick else 20
    actions = chat_session(turns=40, seed=40)
    per_event = [[[a] for a in actions[i * 100 : (i + 1) * 100]] for i in range(n_blocks)]
    turns: list[list[dict[str, Any]]] = []
    for a in actions:
        if a["type"] == "send" or not turns:
            turns.append([])
        turns[-1].append(a)
    per_turn = [turns[i * 2 : i * 2 + 2] for i in range(n_blocks)]
    with tempfile.TemporaryDirectory() as d:
        ours = _store(Path(d) / "ours.db", triggers=True)
        base = _store(Path(d) / "base.db", triggers=False)
        try:
            one = _ratio(ours, base, per_event)
            turn = _ratio(ours, base, [b for b in per_turn if b])
        finally:
            ours.close()
            base.close()
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(["eventstore", "sqlalchemy"], implementation=True),
        "blocks": n_blocks,
        "append_1_event_per_txn": round(one, 3),
        "append_1_turn_per_txn": round(turn, 3),
    }
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))
    md = _markdown(result, quick=args.quick)
    print(md)
    if not args.no_record:
        _record(md)
    return 0


def _markdown(r: dict[str, Any], *, quick: bool) -> str:
    m = r["machine"]
    cmd = "python -m benchmarks audit" + (" --quick" if quick else "")
    return (
        f"{SECTION}\n\n"
        f"Command: `.venv/bin/{cmd}` — {r['date']}\n\n"
        f"Machine: `{m['uname']}`, nproc {m['nproc']}, Python {m['python']}; "
        f"packages {json.dumps(m['packages'])}.\n\n"
        "SQLite appends with revision 0002's insert triggers (which refuse `INSERT OR REPLACE` "
        "of a recorded event) against the same database with those triggers dropped, measured "
        f"in {r['blocks']} alternating blocks; ratio = baseline CPU time ÷ ours (1.0: no cost).\n\n"
        "| append | ratio |\n|---|---:|\n"
        f"| 1 event per transaction | {r['append_1_event_per_txn']:.2f}× |\n"
        f"| 1 turn (≈ 86 events) per transaction | {r['append_1_turn_per_txn']:.2f}× |\n"
    )


def _record(md: str) -> None:
    text_ = RESULTS.read_text(encoding="utf-8")
    start = text_.find(SECTION + "\n")
    if start < 0:
        text_ = text_.rstrip("\n") + "\n\n" + md
    else:
        end = text_.find("\n## ", start + 1)
        text_ = text_[:start] + md + ("" if end < 0 else text_[end:])
    RESULTS.write_text(text_, encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
