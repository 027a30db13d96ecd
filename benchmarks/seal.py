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
    p.add_argument("--json", default=str(HERE / "out" / "seal.json"))
    args = p.parse_args(argv)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.processor() or ''} {platform.python_version()}".strip(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": {},
    }
    print("| T | bytes/event: bare row | eventstore, rows | eventstore, sealed | sealed / bare | "
          "data bytes/event: bare / rows / sealed | sealed / bare (data) | "
          "load head ms (rows / sealed) | checkout T/2 ms (rows / sealed) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in (int(x) for x in args.turns.split(",")):
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
    if args.codec:
        results["codec"] = _codec(split_turns(chat_session(50)))
        print("\n| segment codec (chat_session, 50 turns) | bytes/event | compress µs/event |")
        print("|---|---|---|")
        for c in results["codec"]:
            print(f"| {c['codec']} | {c['bytes_per_event']:.1f} | {c['us_per_event']:.2f} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    return 0
