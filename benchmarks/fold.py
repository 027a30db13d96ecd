"""Fold benchmark: how much does folding cost on top of decoding the stored events?

Run::

    .venv/bin/python -m benchmarks fold                 # ~1 min
    .venv/bin/python -m benchmarks fold --quick         # ~10 s, smaller scaling run
    .venv/bin/python -m benchmarks fold --results benchmarks/RESULTS.md   # also record

Workload: ``eventstore.samples.chat_session(50)`` (~4,300 events), each action encoded
with orjson as the store keeps it (one JSON document per event). Measured in one process,
after a warm-up, as the median (and best) of ``--repeats`` runs with a collected heap:

(a) ``orjson.loads`` of every event — the floor: a load cannot be cheaper than decoding;
(b) decode + :func:`eventstore.core.reducer.fold_json` — the store's load path;
(c) the public :func:`eventstore.core.reducer.fold` over the decoded dicts (validates each
    action with pydantic first — the untrusted path, for reference).

Target: (b) / (a) <= 4. Linearity: per-event cost of (b) at 1k, 10k and 100k events
(more turns of the same generator) must not grow by more than 1.5x from 1k to 100k.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from benchmarks._common import machine as _machine
from benchmarks._common import record_section, timed
from eventstore.core.reducer import fold, fold_json
from eventstore.samples import chat_session

__all__ = ["main", "measure", "machine"]

TARGET_RATIO = 4.0
MAX_GROWTH = 1.5
SECTION = "## Fold (reducer)"
OUT = Path(__file__).parent / "out" / "fold.json"


def _time(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median and best CPU time of ``fn`` in seconds, after ``warmup`` untimed runs.

    CPU time of this process (not wall time): the benchmark often shares a small machine
    with other work, and preemption would otherwise dominate the spread. The garbage
    collector stays on, as in production; the heap is collected before each run.
    """
    return timed(fn, repeats, warmup, clock=time.process_time_ns)


def _time_interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1
) -> dict[str, dict[str, float]]:
    """Like :func:`_time` for several functions, run in rounds (one run of each per round).

    A burst of outside load then hits every variant alike instead of one column.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            gc.collect()
            t0 = time.process_time_ns()
            fn()
            samples[key].append((time.process_time_ns() - t0) / 1e9)
    return {k: {"median": statistics.median(v), "best": min(v)} for k, v in samples.items()}


def _decode_discard(blobs: list[bytes]) -> None:
    loads = orjson.loads
    for b in blobs:
        loads(b)


def _events(n: int, seed: int, *, failing: bool = False) -> list[bytes]:
    turns = math.ceil(n / 86) + 1
    actions = chat_session(turns, seed=seed)
    if failing:
        actions = _with_failures(actions)
    actions = actions[:n]
    assert len(actions) == n, (len(actions), n)
    return [orjson.dumps(a) for a in actions]


def _with_failures(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every turn also loses its connection mid tool call and is retried.

    After each ``tool-result`` a second call starts, a network ``error`` cancels it and a
    ``retry`` resumes: the events whose cost could grow with the conversation (cancelling
    open calls, resumable) once per turn.
    """
    out: list[dict[str, Any]] = []
    for a in actions:
        out.append(a)
        part = a.get("part", {})
        if part.get("type") == "tool-result":
            mid = "a-" + part["id"].split("-", 1)[1] + "-1"
            out.append(
                {
                    "type": "part",
                    "part": {
                        "type": "tool-call",
                        "messageId": mid,
                        "id": part["id"] + "-b",
                        "name": "checkout",
                        "input": {},
                    },
                }
            )
            out.append({"type": "part", "part": {"type": "error", "error": "lost", "code": "network"}})
            out.append({"type": "retry"})
    return out


def measure(turns: int = 50, repeats: int = 15, sizes: Sequence[int] = (1_000, 10_000, 100_000), seed: int = 0) -> dict[str, Any]:
    """Run the whole benchmark and return the figures.

    Args:
        turns: turns of the main workload (``chat_session(turns)``).
        repeats: timed repetitions per measurement (median reported).
        sizes: event counts for the per-event linearity check.
        seed: generator seed.

    Returns:
        A JSON-serialisable dict of results.
    """
    loads = orjson.loads
    blobs = [orjson.dumps(a) for a in chat_session(turns, seed=seed)]
    n = len(blobs)
    decoded = [loads(b) for b in blobs]
    assert fold_json(None, decoded) == fold(decoded).to_json(), "fast path disagrees with fold"

    timed = _time_interleaved(
        {
            "decode": lambda: [loads(b) for b in blobs],
            "floor": lambda: _decode_discard(blobs),
            "load": lambda: fold_json(None, map(loads, blobs)),
            "fold_only": lambda: fold_json(None, decoded),
        },
        repeats,
        warmup=2,
    )
    decode, floor, load, fold_only = (timed[k] for k in ("decode", "floor", "load", "fold_only"))
    public = _time(lambda: fold(decoded), max(3, repeats // 3), warmup=1)

    def rate(t: dict[str, float]) -> float:
        return n / t["median"]

    main_result: dict[str, Any] = {
        "events": n,
        "bytes": sum(len(b) for b in blobs),
        "decode_s": decode,
        "decode_discard_s": floor,
        "decode_fold_json_s": load,
        "fold_json_only_s": fold_only,
        "public_fold_s": public,
        "events_per_s": {
            "decode": rate(decode),
            "decode_fold_json": rate(load),
            "fold_json_only": rate(fold_only),
            "public_fold": rate(public),
        },
        "ratio_median": load["median"] / decode["median"],
        "ratio_best": load["best"] / decode["best"],
        # Against decoding without keeping the dicts: the strictest floor there is.
        "ratio_vs_discard_median": load["median"] / floor["median"],
        "public_fold_ratio_median": (decode["median"] + public["median"]) / decode["median"],
    }

    scaling = []
    for size in sizes:
        sblobs = _events(size, seed)
        # Small sizes run fast and jitter most: give them many more runs (best is kept).
        reps = max(15, min(200, int(400_000 / size)))
        fblobs = _events(size, seed, failing=True)
        # The streaming paths first, while no decoded copy of the events is alive (a big
        # live list, and the holes it leaves in the heap once freed, slow what follows).
        timed = _time_interleaved(
            {
                "load": lambda: fold_json(None, map(loads, sblobs)),
                "fail": lambda: fold_json(None, map(loads, fblobs)),
                "dec": lambda: _decode_discard(sblobs),
            },
            reps,
        )
        t_load, t_fail, t_dec = timed["load"], timed["fail"], timed["dec"]
        del fblobs
        sdecoded = [loads(b) for b in sblobs]
        t_fold = _time(lambda: fold_json(None, sdecoded), reps, warmup=1)
        del sdecoded
        scaling.append(
            {
                "events": size,
                "repeats": reps,
                "decode_fold_json_ns_per_event": t_load["best"] / size * 1e9,
                "fold_json_ns_per_event": t_fold["best"] / size * 1e9,
                "decode_ns_per_event": t_dec["best"] / size * 1e9,
                "decode_fold_json_median_ns_per_event": t_load["median"] / size * 1e9,
                "failing_decode_fold_json_ns_per_event": t_fail["best"] / size * 1e9,
            }
        )
        del sblobs
    first, last = scaling[0], scaling[-1]
    growth = last["decode_fold_json_ns_per_event"] / first["decode_fold_json_ns_per_event"]
    fold_growth = last["fold_json_ns_per_event"] / first["fold_json_ns_per_event"]
    fail_growth = (
        last["failing_decode_fold_json_ns_per_event"] / first["failing_decode_fold_json_ns_per_event"]
    )
    return {
        "benchmark": "fold",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "workload": f"chat_session({turns}, seed={seed}), one orjson document per event",
        "repeats": repeats,
        "main": main_result,
        "scaling": scaling,
        "growth_decode_fold_json": growth,
        "growth_fold_json_only": fold_growth,
        "growth_failing": fail_growth,
        "targets": {
            "ratio_max": TARGET_RATIO,
            "ratio_ok": main_result["ratio_median"] <= TARGET_RATIO
            and main_result["ratio_vs_discard_median"] <= TARGET_RATIO,
            "growth_max": MAX_GROWTH,
            "growth_ok": growth <= MAX_GROWTH and fail_growth <= MAX_GROWTH,
        },
    }


def machine() -> dict[str, Any]:
    """Where the figures come from: OS, CPUs, Python and the versions that matter."""
    return _machine(("eventstore", "orjson", "pydantic", "pydantic-core"), implementation=True)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def render(r: dict[str, Any], command: str) -> str:
    """The results as a markdown section (the RESULTS.md format)."""
    m = r["main"]
    mach = r["machine"]
    rate = m["events_per_s"]
    pk = mach["packages"]
    lines = [
        SECTION,
        "",
        f"Command: `{command}` — {r['date']}",
        "",
        f"Machine: `{mach['uname']}`, nproc {mach['nproc']}, Python {mach['python']}, "
        f"orjson {pk['orjson']}, pydantic {pk['pydantic']} (core {pk['pydantic-core']}).",
        "",
        f"Workload: {r['workload']} — {m['events']:,} events, {m['bytes']:,} bytes. "
        f"CPU time of the process, median of {r['repeats']} runs after warm-up (best in parentheses); "
        "GC on.",
        "",
        "| path | time (ms) | events/s | × decode |",
        "|---|---:|---:|---:|",
        f"| (a) `orjson.loads` of every event | {_ms(m['decode_s']['median'])} ({_ms(m['decode_s']['best'])}) "
        f"| {rate['decode']:,.0f} | 1.00 |",
        f"| (a') `orjson.loads` of every event, results discarded | {_ms(m['decode_discard_s']['median'])} "
        f"({_ms(m['decode_discard_s']['best'])}) | {m['events'] / m['decode_discard_s']['median']:,.0f} "
        f"| {m['decode_discard_s']['median'] / m['decode_s']['median']:.2f} |",
        f"| (b) decode + `fold_json` (store load path) | {_ms(m['decode_fold_json_s']['median'])} "
        f"({_ms(m['decode_fold_json_s']['best'])}) | {rate['decode_fold_json']:,.0f} "
        f"| **{m['ratio_median']:.2f}** ({m['ratio_best']:.2f}) |",
        f"| `fold_json` alone on decoded dicts | {_ms(m['fold_json_only_s']['median'])} "
        f"| {rate['fold_json_only']:,.0f} | {m['fold_json_only_s']['median'] / m['decode_s']['median']:.2f} |",
        f"| (c) public `fold` on decoded dicts (validates) | {_ms(m['public_fold_s']['median'])} "
        f"| {rate['public_fold']:,.0f} | {m['public_fold_s']['median'] / m['decode_s']['median']:.2f} |",
        "",
        f"Ratio (b)/(a) = **{m['ratio_median']:.2f}**, (b)/(a') = **{m['ratio_vs_discard_median']:.2f}** "
        f"(target ≤ {TARGET_RATIO:g}: "
        f"{'met' if r['targets']['ratio_ok'] else 'MISSED'}).",
        "",
        "Per-event cost by session length (best of the runs, CPU time):",
        "",
        "| events | decode + fold_json (ns/event) | fold_json alone (ns/event) | decode alone (ns/event) "
        "| decode + fold_json, error + retry every turn (ns/event) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for s in r["scaling"]:
        lines.append(
            f"| {s['events']:,} | {s['decode_fold_json_ns_per_event']:.0f} | "
            f"{s['fold_json_ns_per_event']:.0f} | {s['decode_ns_per_event']:.0f} "
            f"| {s['failing_decode_fold_json_ns_per_event']:.0f} |"
        )
    lines += [
        "",
        f"Growth of the per-event cost from {r['scaling'][0]['events']:,} to "
        f"{r['scaling'][-1]['events']:,} events: {r['growth_decode_fold_json']:.2f}× "
        f"(fold alone {r['growth_fold_json_only']:.2f}×, error + retry every turn "
        f"{r['growth_failing']:.2f}×; limit {MAX_GROWTH:g}×: "
        f"{'met' if r['targets']['growth_ok'] else 'MISSED'}).",
        "",
        "How to read it: (a) is the floor a load can never beat — the store must decode every "
        "stored event; (a') is the same decode with the dicts thrown away at once, the strictest "
        "possible floor. (b) is what `EventStore.load` does per event after reading the rows: "
        "decode, then apply with `fold_json` (no validation; events were validated on append). "
        "Times are CPU time of the process so that other work on a shared machine does not "
        "inflate them; the per-event table keeps the best run per size. The error + retry column "
        "adds, every turn, a second tool call cut by a network `error` and a `retry` — the events "
        "whose cost could grow with the conversation (cancelling open calls, resuming). The "
        "limit applies to the streaming columns (what a load does); `fold_json` alone walks a "
        "pre-decoded list that at 100k events no longer fits in the CPU caches, so it is "
        "shown for reference only.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fold benchmark, print a markdown table and write ``benchmarks/out/fold.json``.

    Args:
        argv: command-line arguments (see ``--help``).

    Returns:
        0 when both targets are met, 1 otherwise.
    """
    p = argparse.ArgumentParser(prog="python -m benchmarks fold", description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=50, help="turns of the main workload (default 50)")
    p.add_argument("--repeats", type=int, default=31, help="timed runs per main measurement (default 31)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="fewer repeats, scaling up to 30k events")
    p.add_argument("--json", type=Path, default=OUT, help=f"results JSON (default {OUT})")
    p.add_argument("--results", type=Path, default=None, help="also record the section in this RESULTS.md")
    args = p.parse_args(argv)
    sizes = (1_000, 3_000, 30_000) if args.quick else (1_000, 10_000, 100_000)
    repeats = min(args.repeats, 5) if args.quick else args.repeats
    r = measure(turns=args.turns, repeats=repeats, sizes=sizes, seed=args.seed)
    command = "python -m benchmarks fold" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    r["command"] = command
    section = render(r, command)
    print(section)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(r, indent=2) + "\n")
    if args.results is not None:
        record_section(args.results, SECTION, section)
    return 0 if r["targets"]["ratio_ok"] and r["targets"]["growth_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
