"""Audit benchmark: what the SQLite insert triggers of revision 0002 cost an append.

Run::

    .venv/bin/python -m benchmarks audit              # ~1 min
    .venv/bin/python -m benchmarks audit --quick      # ~15 s
    ... --no-record      # do not rewrite the "## Audit" section of benchmarks/RESULTS.md
    .venv/bin/python -m benchmarks audit --checkpoints [--sessions N --events-per-session M --import-mb MB]

``--checkpoints`` measures instead (section "## Audit: checkpoints and import memory"): the
time to sign a checkpoint of N sessions and to verify against it, with plain ``verify`` of
the same database as the baseline of the same run; and the peak RSS of a process importing a
generated export file of about MB megabytes, against the same process importing a one-event
file.

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

from benchmarks._common import machine, record_section
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
    parser.add_argument("--checkpoints", action="store_true", help="checkpoint, verify and import-memory figures")
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--events-per-session", type=int, default=100)
    parser.add_argument("--import-mb", type=int, default=100)
    args = parser.parse_args(argv)
    if args.checkpoints:
        return _checkpoints_main(args)
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
        record_section(RESULTS, SECTION, md)
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



# -- checkpoints, verify and import memory ---------------------------------------------------

CHECKPOINT_SECTION = "## Audit: checkpoints and import memory"

_IMPORT_CHILD = """
import resource, sys
from eventstore import EventStore
with EventStore(sys.argv[1]) as store:
    store.migrate()
    with open(sys.argv[2], encoding="utf-8") as fh:
        n = sum(r.events for r in store.import_(fh))
print(n, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _fill(store: EventStore, sessions: int, per_session: int) -> int:
    actions = chat_session(turns=max(1, per_session // 40), seed=7)
    while len(actions) < per_session:
        actions += chat_session(turns=1, seed=len(actions))
    batch = actions[:per_session]
    for i in range(sessions):
        store.append(f"chat-{i:06d}", batch)
    return sessions * len(batch)


def _export_file(path: Path, megabytes: int) -> int:
    """A valid export of one session of about ``megabytes`` MB, hashes computed here
    (appending that many events first would take far longer than the import measured)."""
    from eventstore.core.codec import canonical, recorded_hash
    from eventstore.core.rows import ZERO_HASH, EventRow

    turns = chat_session(turns=200, seed=3)
    target = megabytes * 1_000_000
    prev, turn, version, size = ZERO_HASH, 0, 0, 0
    with path.with_suffix(".body").open("w", encoding="utf-8") as body:
        while size < target:
            for a in turns:
                version += 1
                a = dict(a)
                if a["type"] == "send":
                    turn += 1
                    a["id"] = f"u-{version}"
                payload = canonical(a)
                row = EventRow(0, version, None, a["type"], turn, payload, 1_700_000_000_000_000 + version, None, None, b"")
                prev = recorded_hash(prev, "big", row)
                line = json.dumps(
                    {"kind": "event", "session": "big", "version": version, "event_id": None, "type": a["type"],
                     "turn": turn, "action": a, "recorded_at": row.recorded_at, "actor": None, "metadata": None,
                     "hash": prev.hex()}
                )
                body.write(line + "\n")
                size += len(line) + 1
                if size >= target:
                    break
    head = {"format": "eventstore-export", "format_version": 1, "session": "big", "sessions": ["big"], "events": version}
    meta = {"kind": "session", "id": "big", "parent": None, "fork_version": None, "fork_hash": ZERO_HASH.hex(),
            "fork_turn": 0, "head": version, "head_hash": prev.hex(), "head_turn": turn, "baseline": 0,
            "baseline_hash": None, "baseline_turn": 0, "baseline_state": None, "baseline_record": None,
            "created_at": 1_700_000_000_000_000, "events": version}
    with path.open("w", encoding="utf-8") as out, path.with_suffix(".body").open(encoding="utf-8") as body:
        out.write(json.dumps(head) + "\n" + json.dumps(meta) + "\n")
        for line in body:
            out.write(line)
    path.with_suffix(".body").unlink()
    return version


def _import_rss(d: Path, file: Path) -> tuple[int, int]:
    import subprocess
    import sys

    db = d / f"import-{file.stem}.db"
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHILD, f"sqlite:///{db}", str(file)], check=True, capture_output=True, text=True
    ).stdout.split()
    return int(out[0]), int(out[1])  # events, peak RSS in kB


def _checkpoints_main(args: argparse.Namespace) -> int:
    from eventstore import generate_keypair

    private, public = generate_keypair()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        store = EventStore(f"sqlite:///{d / 'many.db'}")
        store.migrate()
        t0 = time.perf_counter()
        n_events = _fill(store, args.sessions, args.events_per_session)
        fill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        cp = store.checkpoint(private)
        sign_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        plain = store.verify()
        plain_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        anchored = store.verify(checkpoint=cp, public_key=public)
        anchored_s = time.perf_counter() - t0
        assert plain.ok and anchored.ok
        store.close()
        big = d / "big.jsonl"
        big_events = _export_file(big, args.import_mb)
        small = d / "small.jsonl"
        _export_file(small, 0)
        _, base_kb = _import_rss(d, small)
        got, peak_kb = _import_rss(d, big)
        assert got == big_events
        file_mb = big.stat().st_size / 1e6
    r = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(["eventstore", "sqlalchemy", "cryptography"], implementation=True),
        "sessions": args.sessions,
        "events": n_events,
        "fill_s": round(fill_s, 1),
        "checkpoint_s": round(sign_s, 3),
        "checkpoint_bytes": len(cp.to_json()),
        "verify_s": round(plain_s, 2),
        "verify_checkpoint_s": round(anchored_s, 2),
        "import_file_mb": round(file_mb, 1),
        "import_events": big_events,
        "import_peak_rss_mb": round(peak_kb / 1024, 1),
        "import_base_rss_mb": round(base_kb / 1024, 1),
    }
    (OUT.parent / "audit-checkpoints.json").parent.mkdir(exist_ok=True)
    (OUT.parent / "audit-checkpoints.json").write_text(json.dumps(r, indent=2))
    m = r["machine"]
    md = (
        f"{CHECKPOINT_SECTION}\n\n"
        f"Command: `.venv/bin/python -m benchmarks audit --checkpoints --sessions {args.sessions} "
        f"--events-per-session {args.events_per_session} --import-mb {args.import_mb}` — {r['date']}\n\n"
        f"Machine: `{m['uname']}`, nproc {m['nproc']}, Python {m['python']}; packages {json.dumps(m['packages'])}. "
        "SQLite (WAL); the machine is shared, so absolute times are indicative.\n\n"
        f"{r['sessions']:,} sessions, {r['events']:,} events (filled in {r['fill_s']} s).\n\n"
        "| operation | time | × plain verify |\n|---|---:|---:|\n"
        f"| `checkpoint()` (read every head, sign; {r['checkpoint_bytes'] / 1e6:.1f} MB of JSON) | {r['checkpoint_s']:.3f} s | "
        f"{r['checkpoint_s'] / r['verify_s']:.3f} |\n"
        f"| plain `verify()` (baseline: every chain and snapshot) | {r['verify_s']:.2f} s | 1.00 |\n"
        f"| `verify(checkpoint=..., public_key=...)` (the same, plus every anchor) | {r['verify_checkpoint_s']:.2f} s | "
        f"{r['verify_checkpoint_s'] / r['verify_s']:.2f} |\n\n"
        f"Import of a generated {r['import_file_mb']} MB export file (one session, {r['import_events']:,} events) "
        f"in a fresh process: peak RSS {r['import_peak_rss_mb']} MB, against {r['import_base_rss_mb']} MB for the same "
        "process importing a file with no events. Before the import read line by line, a 111 MB file peaked at 964 MB.\n"
    )
    print(md)
    if not args.no_record:
        text_ = RESULTS.read_text(encoding="utf-8")
        start = text_.find(CHECKPOINT_SECTION + "\n")
        if start < 0:
            text_ = text_.rstrip("\n") + "\n\n" + md
        else:
            end = text_.find("\n## ", start + 1)
            text_ = text_[:start] + md + ("" if end < 0 else text_[end:])
        RESULTS.write_text(text_, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
