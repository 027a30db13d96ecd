"""Sealed segments: bytes per event with sealing on, against the bare row, in one run.

``python -m benchmarks seal [--turns 50,200] [--codec]`` writes one ``chat_session`` of T
turns (one append per turn) into: the bare table of ``benchmarks/peers/raw_psycopg.py``
(the baseline every ratio is against), eventstore with ``seal=False``, and eventstore
sealing as it goes (the background sealer, then ``store.seal()`` after each turn so that
the measurement never depends on how far behind it was, and ``VACUUM events`` after each
turn, as a busy table's autovacuum would, so the space of sealed rows is reused). Bytes are
tables + indexes + TOAST after ``VACUUM`` (``benchmarks.peers.base.pg_size``), in total and
as data: minus the same database right after its schema was created (eventstore's dozen
tables and their indexes weigh ~0.6 MB before the first event, which is 35 bytes per event
of a 200-turn session). It also times the head load and an old-version checkout.

``--marginal`` measures what a second session of the same length adds to a database that
already holds one (after ``VACUUM FULL``: live data), table by table — the rule of
``python -m benchmarks compare``'s "+1 session" column, which leaves out the schema's fixed
cost — for the bare table, eventstore with ``seal=False``, and eventstore sealing with
``snapshot_every`` at 128 and at the default (keeping every snapshot inside sealed turns, one
in two — the default — and one in four); then the client CPU time of a head load and of
old-version checkouts on those stores, in interleaved rounds (medians).

``--codec`` measures the segment codec on its own (zlib at 6 and 9, zstd at 3 and 19, with
and without a dictionary trained on other turns, if ``zstandard`` is importable): bytes per
event of a sealed body and compression time, over the turns of the same workload.

Needs PostgreSQL (run under ``scripts/with-postgres``). Writes ``benchmarks/out/seal.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from benchmarks._common import split_turns
from benchmarks.peers.base import pg_url
from benchmarks.peers.eventstore_target import EventstoreTarget
from benchmarks.peers.raw_psycopg import RawPsycopg
from eventstore.engine import sealer
from eventstore.samples import chat_session

__all__ = ["main"]

HERE = Path(__file__).resolve().parent


def _ms(f: Any, repeats: int = 7) -> float:
    f()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def _run(target: Any, tag: str, turns: list[list[dict[str, Any]]], *, seal: bool) -> dict[str, Any]:
    target.open(tag)
    try:
        empty = target.size_bytes()  # the schema alone: tables, indexes, catalogue pages
        n = 0
        for turn in turns:
            target.append("s", turn)
            n += len(turn)
            if seal:
                target.store.seal()
                with psycopg.connect(pg_url(target.db), autocommit=True) as conn:
                    conn.execute("VACUUM events")
        out: dict[str, Any] = {"events": n, "bytes": target.size_bytes(), "empty_bytes": empty}
        out["bytes_per_event"] = out["bytes"] / n
        out["data_bytes_per_event"] = (out["bytes"] - empty) / n
        if hasattr(target, "store"):
            out["load_head_ms"] = _ms(lambda: target.load("s"))
            out["checkout_ms"] = _ms(lambda: target.load("s", n // 2))
        return out
    finally:
        target.close()


_RELATIONS = """
SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg_toast%'
"""


def _live_sizes(db: str) -> dict[str, int]:
    """Each table's bytes (with its indexes and TOAST) after ``VACUUM FULL``."""
    with psycopg.connect(pg_url(db), autocommit=True) as conn:
        conn.execute("VACUUM FULL")
        conn.execute("VACUUM")
        return {str(name): int(size) for name, size in conn.execute(_RELATIONS).fetchall()}


# (name, snapshot_every, seal, how many snapshots in sealed turns are one kept: see
# eventstore.engine.sealer.SEALED_SNAPSHOT_SPACING; 1 keeps them all, as before thinning).
_VARIANTS = (
    ("bare row", None, False, None),
    ("eventstore, rows, snapshot_every=128", 128, False, None),
    ("eventstore, sealed, snapshot_every=128", 128, True, None),
    ("eventstore, sealed, every sealed snapshot kept", None, True, 1),
    ("eventstore, sealed (the defaults)", None, True, None),
    ("eventstore, sealed, one sealed snapshot in 4 kept", None, True, 4),
)


def _marginal(t: int, rounds: int) -> dict[str, Any]:
    """Bytes a second ``t``-turn session adds, table by table, and interleaved read times."""
    first = split_turns(chat_session(t, 20251129))
    second = split_turns(chat_session(t, 20251130))
    n2 = sum(map(len, second))
    out: dict[str, Any] = {"events": n2, "variants": {}}
    opened = []
    default_spacing = sealer.SEALED_SNAPSHOT_SPACING
    for i, (name, every, seal, spacing) in enumerate(_VARIANTS):
        target: Any = RawPsycopg() if i == 0 else EventstoreTarget("postgresql", every, seal=seal)
        target.key = f"marg{i}"
        target.open(f"m{t}")
        sealer.SEALED_SNAPSHOT_SPACING = spacing or default_spacing
        try:
            for session, turns in (("a", first), ("b", second)):
                for turn in turns:
                    target.append(session, turn)
                settle = getattr(target, "settle", None)
                if settle is not None:
                    settle()
                if session == "a":
                    before = _live_sizes(target.db)
        finally:
            sealer.SEALED_SNAPSHOT_SPACING = default_spacing
        after = _live_sizes(target.db)
        grew = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        out["variants"][name] = {"bytes_per_event": sum(grew.values()) / n2, "tables": grew}
        opened.append((name, target))
    # Client CPU (decoding, re-hashing, folding): the part sealing changes; wall times on
    # this shared machine move by more than the differences.
    half = sum(map(len, first[: t // 2]))
    reads = {"head": None, "checkout T/2": half, "checkout T/2 + 40": half + 40}
    times: dict[str, dict[str, list[float]]] = {name: {k: [] for k in reads} for name, _ in opened[1:]}
    for _ in range(rounds):
        for name, target in opened[1:]:
            for k, v in reads.items():
                c0 = time.process_time()
                target.load("a", v)
                times[name][k].append(time.process_time() - c0)
    for name, per in times.items():
        out["variants"][name]["cpu_ms"] = {k: statistics.median(v) * 1000 for k, v in per.items()}
    for _, target in opened:
        target.close()
    return out


def _codec(turns: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each codec's bytes per event and compression time over the turns' sealed bodies."""
    from eventstore.core.rows import SealedEvent
    from eventstore.core.segments import encode_segment
    from eventstore.engine.engine import Engine

    eng = Engine("sqlite://", seal=False)
    eng.migrate()
    for t in turns:
        eng.append("s", t)
    with eng.storage.read() as tx:
        rows = eng.storage.read_events(tx, 1, after=0, upto=10**9)
    eng.close()
    by_turn: dict[int, list[Any]] = {}
    for r in rows:
        by_turn.setdefault(r.turn, []).append(SealedEvent(r, 1000 + r.version))
    raw = [zlib.decompress(encode_segment(g, "s")[1:]) for g in by_turn.values()]
    n = len(rows)
    codecs: list[tuple[str, Any]] = [
        ("zlib 6", lambda b: zlib.compress(b, 6)),
        ("zlib 9 (chosen)", lambda b: zlib.compress(b, 9)),
    ]
    try:
        import zstandard

        half = max(1, len(raw) // 2)
        trained = zstandard.train_dictionary(16384, raw[:half])
        for level in (3, 19):
            codecs.append((f"zstd {level}", zstandard.ZstdCompressor(level=level).compress))
            codecs.append(
                (f"zstd {level} + 16 KiB dictionary", zstandard.ZstdCompressor(level=level, dict_data=trained).compress)
            )
    except ImportError:
        pass
    out = []
    for name, compress in codecs:
        t = time.perf_counter()
        size = sum(len(compress(b)) for b in raw)
        out.append({"codec": name, "bytes_per_event": size / n, "us_per_event": (time.perf_counter() - t) / n * 1e6})
    out.append({"codec": "uncompressed columns", "bytes_per_event": sum(map(len, raw)) / n, "us_per_event": 0.0})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement and print a markdown table."""
    p = argparse.ArgumentParser(prog="python -m benchmarks seal", description=__doc__)
    p.add_argument("--turns", default="50,200")
    p.add_argument("--codec", action="store_true", help="also compare segment codecs")
    p.add_argument("--marginal", action="store_true",
                   help="bytes a second session adds, by table, and interleaved read CPU times")
    p.add_argument("--rounds", type=int, default=30, help="interleaved read rounds (--marginal)")
    p.add_argument("--skip-table", action="store_true", help="leave out the whole-database table")
    p.add_argument("--json", default=str(HERE / "out" / "seal.json"))
    args = p.parse_args(argv)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.processor() or ''} {platform.python_version()}".strip(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": {},
    }
    if not args.skip_table:
        print("| T | bytes/event: bare row | eventstore, rows | eventstore, sealed | sealed / bare | "
              "data bytes/event: bare / rows / sealed | sealed / bare (data) | "
              "load head ms (rows / sealed) | checkout T/2 ms (rows / sealed) |")
        print("|---|---|---|---|---|---|---|---|---|")
    for t in (int(x) for x in args.turns.split(",") if not args.skip_table):
        turns = split_turns(chat_session(t))
        raw = _run(RawPsycopg(), f"seal{t}", turns, seal=False)
        rows_target = EventstoreTarget("postgresql", seal=False)
        sealed_target = EventstoreTarget("postgresql")
        rows_target.key, sealed_target.key = "es-rows", "es-sealed"
        rows = _run(rows_target, f"seal{t}", turns, seal=False)
        sealed = _run(sealed_target, f"seal{t}", turns, seal=True)
        results["runs"][t] = {"raw": raw, "rows": rows, "sealed": sealed}
        print(
            f"| {t} | {raw['bytes_per_event']:.1f} | {rows['bytes_per_event']:.1f} "
            f"({rows['bytes_per_event'] / raw['bytes_per_event']:.2f}×) | {sealed['bytes_per_event']:.1f} "
            f"| {sealed['bytes_per_event'] / raw['bytes_per_event']:.3f}× "
            f"| {raw['data_bytes_per_event']:.1f} / {rows['data_bytes_per_event']:.1f} / "
            f"{sealed['data_bytes_per_event']:.1f} "
            f"| **{sealed['data_bytes_per_event'] / raw['data_bytes_per_event']:.3f}×** "
            f"| {rows['load_head_ms']:.2f} / {sealed['load_head_ms']:.2f} "
            f"| {rows['checkout_ms']:.2f} / {sealed['checkout_ms']:.2f} |",
            flush=True,
        )
    if args.marginal:
        results["marginal"] = {}
        for t in (int(x) for x in args.turns.split(",")):
            m = results["marginal"][t] = _marginal(t, args.rounds)
            base = m["variants"]["bare row"]["bytes_per_event"]
            print(f"\nA second {t}-turn session ({m['events']:,} events) added, per event (÷ bare row), "
                  "by table, and the client CPU of reads on the first (medians, ms):\n")
            print("| store | bytes/event | by table | load head | checkout T/2 | checkout T/2 + 40 |")
            print("|---|---|---|---|---|---|")
            for name, v in m["variants"].items():
                tables = ", ".join(f"{k} {b / m['events']:.1f}"
                                   for k, b in sorted(v["tables"].items(), key=lambda kv: -kv[1]))
                cpu = v.get("cpu_ms", {})
                print(f"| {name} | {v['bytes_per_event']:.1f} ({v['bytes_per_event'] / base:.3f}×) | {tables} | "
                      + " | ".join(f"{cpu[k]:.2f}" if k in cpu else "–"
                                   for k in ("head", "checkout T/2", "checkout T/2 + 40")) + " |", flush=True)
    if args.codec:
        results["codec"] = _codec(split_turns(chat_session(50)))
        print("\n| segment codec (chat_session, 50 turns) | bytes/event | compress µs/event |")
        print("|---|---|---|")
        for c in results["codec"]:
            print(f"| {c['codec']} | {c['bytes_per_event']:.1f} | {c['us_per_event']:.2f} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    return 0
