"""The head load against a decode of the head state, sealed and not, against a revision.

Run (PostgreSQL comes from scripts/with-postgres)::

    scripts/with-postgres .venv/bin/python -m benchmarks headload            # against main's parent
    ... --baseline REV[,REV...] --backends postgresql,sqlite --rounds 41 --no-record
    ... --pieces    # this tree only, in this process: the thread CPU of each piece of a head load
    ... --loads cold --rounds 201   # only the first load in a process, over many rounds

One ``chat_session(200, seed=20251129)`` (≈ 17,000 events) is written one turn per append by
each tree (this one and each ``--baseline`` revision, extracted from git and run in a worker
process of its own, its tree first on ``sys.path``) into a database of its own, once with
``seal=False`` and once with ``seal=True`` (then ``store.seal()``: every closed turn sealed).
Then, in interleaved rounds (the order rotating each round), three things are timed:

- the baseline: ``orjson.loads`` of the head state's canonical JSON (``codec.canonical`` of
  the state's wire dict, sorted keys, compact: what the store writes), in this process;
- ``store.load(s)``, the head, as a ``SessionState``;
- ``store.load(s, version=v)`` with ``v`` the version at the end of turn T/2 (a checkout of
  an old version).
- ``store.load(s)`` again, the store's decoded snapshot blobs forgotten first (untimed): a
  head load that decodes every blob, as the first load of a session in a process does.

Each worker times its own call, so the pipe is never in a figure. Figures are medians over
rounds; a ratio is the median over rounds of that round's time ÷ that round's decode. Beside
the wall-clock ratio, the CPU ratio: the CPU time of the loading thread ÷ that of the decode
(on a machine shared by many processes a longer call is more often preempted, which inflates
the wall-clock ratio; the CPU ratio leaves out the PostgreSQL server's share).

Each worker also times the same ``orjson.loads`` of the head JSON itself, right after its
loads, woken by a command like them: the last columns divide the loads' CPU by that decode's
(same process, same heap, same wake-up from the pipe). The decode in this process runs
right after a ``gc.collect()``, in a process that does nothing else between decodes: the
code and the allocator it runs through are warmer than in a worker that has just read from a
database.

Every tree's head and checkout states are first compared with the reference fold.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from benchmarks._common import extract_tree, machine, split_turns
from benchmarks.hotpath import Worker, databases
from eventstore.core.codec import canonical
from eventstore.core.reducer import fold_json
from eventstore.samples import chat_session

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "out" / "headload.json"
SEED = 20251129

# The worker: one EventStore of whichever tree is first on sys.path; it times its own calls.
_WORKER = r"""
import json, sys, time
import orjson
from eventstore import EventStore
store = None
head_json = b""
for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd["op"]
    if op == "open":
        store = EventStore(cmd["url"], seal=cmd["seal"])
        store.migrate()
        out = {}
    elif op == "append_turns":
        for t in cmd["turns"]:
            store.append(cmd["sid"], t)
        out = {}
    elif op == "seal":
        out = {"sealed": store.seal() if cmd["seal"] else 0}
    elif op == "load":
        codec = getattr(store._engine.planner, "codec", None)
        if cmd.get("cold") and hasattr(codec, "forget_decoded"):  # a tree with a decoded-blob
            codec.forget_decoded()  # cache: emptied first, untimed, budget included
        elif cmd.get("cold") and hasattr(codec, "_decoded"):  # a baseline tree of before it had
            codec._decoded.clear()  # forget_decoded (else every ~85th load clears the cache
            codec._decoded_bytes = 0  # inside the timing)
        c0, t0 = time.thread_time(), time.perf_counter()
        store.load(cmd["sid"], version=cmd["version"])
        out = {"s": time.perf_counter() - t0, "cpu": time.thread_time() - c0}
    elif op == "head_json":
        head_json = cmd["json"].encode()
        out = {}
    elif op == "decode":
        c0, t0 = time.thread_time(), time.perf_counter()
        orjson.loads(head_json)
        out = {"s": time.perf_counter() - t0, "cpu": time.thread_time() - c0}
    elif op == "state":
        out = {"state": store.load(cmd["sid"], version=cmd["version"]).to_json()}
    elif op == "close":
        store.close()
        break
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


def _figures(backend: str, trees: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    actions = chat_session(args.turns, seed=SEED)
    turns = split_turns(actions)
    half = sum(len(t) for t in turns[: len(turns) // 2])
    head_json = canonical(fold_json(None, actions))
    expected = {None: orjson.loads(head_json), half: fold_json(None, actions[:half])}
    configs = [(name, seal) for name in trees for seal in (False, True)]
    with databases(backend, args.pg_url, len(configs)) as urls:
        workers = {(name, seal): Worker(trees[name], _WORKER) for name, seal in configs}
        try:
            for ((name, seal), w), url in zip(workers.items(), urls):
                w.call("open", url=url, seal=seal)
                w.call("head_json", json=head_json.decode())
                for i in range(0, len(turns), 20):
                    w.call("append_turns", sid="big", turns=turns[i : i + 20])
                w.call("seal", seal=seal)
                for v, state in expected.items():
                    if w.call("state", sid="big", version=v)["state"] != state:
                        raise RuntimeError(f"{name} (seal={seal}): the state at {v} differs from the fold")
            keys = [*workers, "decode"]
            head: dict[Any, list[tuple[float, float]]] = {k: [] for k in keys}
            old: dict[Any, list[tuple[float, float]]] = {k: [] for k in workers}
            cold: dict[Any, list[tuple[float, float]]] = {k: [] for k in workers}
            in_worker: dict[Any, list[tuple[float, float]]] = {k: [] for k in workers}
            for w in workers.values():  # warm-up: prepared statements, caches
                w.call("load", sid="big", version=None)
                w.call("load", sid="big", version=half)
            for i in range(args.rounds):
                k = i % len(keys)
                for key in keys[k:] + keys[:k]:
                    if key == "decode":
                        gc.collect()
                        c0, t0 = time.thread_time(), time.perf_counter()
                        orjson.loads(head_json)
                        head[key].append((time.perf_counter() - t0, time.thread_time() - c0))
                    else:
                        for what, into, v, c in (
                            ("head", head, None, 0),
                            ("checkout", old, half, 0),
                            ("cold", cold, None, 1),
                        ):
                            if what not in args.loads:
                                continue
                            r = workers[key].call("load", sid="big", version=v, cold=c)
                            into[key].append((r["s"], r["cpu"]))
                        r = workers[key].call("decode")
                        in_worker[key].append((r["s"], r["cpu"]))
        finally:
            for w in workers.values():
                w.close()
    decode = head["decode"]
    out: dict[str, Any] = {
        "events": len(actions),
        "checkout_version": half,
        "state_bytes": len(head_json),
        "decode_ms": statistics.median(d[0] for d in decode) * 1e3,
        "decode_cpu_ms": statistics.median(d[1] for d in decode) * 1e3,
        "trees": {},
    }
    for name, seal in configs:
        f: dict[str, float] = {}
        mine = in_worker[(name, seal)]
        f["worker_decode_cpu_ms"] = statistics.median(d[1] for d in mine) * 1e3
        for what, runs in (
            ("head", head[(name, seal)]),
            ("checkout", old[(name, seal)]),
            ("cold_head", cold[(name, seal)]),
        ):
            if not runs:  # not measured (--loads)
                runs = [(float("nan"), float("nan"))] * len(decode)
            f[f"{what}_ms"] = statistics.median(r[0] for r in runs) * 1e3
            f[f"{what}_ratio"] = statistics.median(r[0] / d[0] for r, d in zip(runs, decode))
            f[f"{what}_cpu_ratio"] = statistics.median(r[1] / max(d[1], 1e-9) for r, d in zip(runs, decode))
            f[f"{what}_worker_cpu_ratio"] = statistics.median(
                r[1] / max(d[1], 1e-9) for r, d in zip(runs, mine)
            )
        out["trees"].setdefault(name, {})["sealed" if seal else "rows"] = f
    return out


def _pieces(backend: str, args: argparse.Namespace) -> dict[str, float]:
    """Median thread CPU (ms per call) of each piece of this tree's head load, in blocks of
    20 calls per piece, the pieces interleaved and rotating over the rounds."""
    from eventstore import EventStore
    from eventstore.core.appends import state_from_parts
    from eventstore.core.codec import SnapshotCodec
    from eventstore.core.models import SessionState
    from eventstore.core.reducer import REDUCER_VERSION
    from eventstore.storage import open_storage

    actions = chat_session(args.turns, seed=SEED)
    head_json = canonical(fold_json(None, actions))
    with databases(backend, args.pg_url, 1) as (url,):
        store = EventStore(url, seal=False)
        store.migrate()
        for turn in split_turns(actions):
            store.append("big", turn)
        storage = open_storage(url)
        del actions
        gc.collect()
        fetch = lambda: storage.load_parts("big", None, REDUCER_VERSION)  # noqa: E731
        parts = fetch()
        assert parts is not None and parts.row is not None
        head = parts.row.head
        snap = SnapshotCodec.decode(parts.rest or b"{}", parts.bodies)
        codec = SnapshotCodec()  # fresh bytes objects each call, as a read gives

        def load_collector_off() -> Any:
            gc.disable()
            try:
                return store.load("big")
            finally:
                gc.enable()

        pieces: dict[str, Any] = {
            "orjson.loads of the head JSON (the baseline)": lambda: orjson.loads(head_json),
            "load_parts (the read)": fetch,
            "snapshot decode (LZ4, join, orjson)": lambda: SnapshotCodec.decode(parts.rest or b"{}", parts.bodies),
            "snapshot, blobs decoded before (SnapshotCodec.load; copies of the blobs)": lambda: (
                codec.load(parts.rest or b"{}", [bytes(bytearray(b)) for b in parts.bodies])
            ),
            "tail: decode and fold": lambda: fold_json(snap, orjson.loads(b"[" + parts.tail + b"]")),
            "SessionState.from_trusted": lambda: SessionState.from_trusted(snap),
            "state_from_parts (decode + tail), parts read once": lambda: state_from_parts(parts, head),
            "load_parts, then orjson.loads of the head JSON": lambda: (fetch(), orjson.loads(head_json)),
            "load_parts, then state_from_parts": lambda: state_from_parts(fetch(), head),  # type: ignore[arg-type]
            "store.load": lambda: store.load("big"),
            "store.load with the cyclic collector off (what it costs)": load_collector_off,
        }
        runs: dict[str, list[float]] = {k: [] for k in pieces}
        keys = list(pieces)
        for i in range(args.rounds):
            k = i % len(keys)
            for key in keys[k:] + keys[:k]:
                f = pieces[key]
                c0 = time.thread_time()
                for _ in range(20):
                    f()
                runs[key].append((time.thread_time() - c0) / 20)
        storage.close()
        store.close()
    return {k: statistics.median(v) * 1e3 for k, v in runs.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The figures on every backend; the baseline trees extracted to a temporary directory."""
    res: dict[str, Any] = {
        "benchmark": "headload",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(["eventstore", "psycopg", "SQLAlchemy", "pydantic", "orjson", "lz4"]),
        "baselines": args.baseline,
        "load_before": os.getloadavg(),
        "backends": {},
    }
    with tempfile.TemporaryDirectory(prefix="es-headload-tree-") as tmp:
        trees: dict[str, Path] = {}
        for i, rev in enumerate(args.baseline):
            (Path(tmp) / str(i)).mkdir()
            trees[rev] = extract_tree(ROOT, rev, Path(tmp) / str(i))
        trees["this tree"] = ROOT
        for backend in args.backends:
            res["backends"][backend] = _figures(backend, trees, args)
            print(backend, json.dumps(res["backends"][backend], indent=1), flush=True)
    res["load_after"] = os.getloadavg()
    return res


def render(res: dict[str, Any], command: str) -> str:
    """The table of a run, for RESULTS.md."""
    m = res["machine"]
    la = ", ".join(f"{x:.1f}" for x in (*res["load_before"][:1], *res["load_after"][:1]))
    lines = [
        f"Command: `{command}` — {res['date']}; load average {la} (before, after).",
        "",
        f"Machine: `{m['uname']}`, nproc {m['nproc']}, Python {m['python']}; packages {json.dumps(m['packages'])}.",
        "",
        "| backend | tree | sealed | events | state KB | decode ms | head ms | head ÷ decode (CPU) "
        "| checkout T/2 ms | checkout ÷ decode (CPU) | head, decoded blobs forgotten ÷ decode (CPU) "
        "| worker's decode CPU ms | head ÷ worker's decode (CPU) | checkout ÷ worker's decode (CPU) "
        "| head, forgotten ÷ worker's decode (CPU) |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for backend, r in res["backends"].items():
        for name, by_seal in r["trees"].items():
            for kind, f in by_seal.items():
                lines.append(
                    f"| {backend} | {name} | {'yes' if kind == 'sealed' else 'no'} | {r['events']:,} "
                    f"| {r['state_bytes'] / 1024:.0f} | {r['decode_ms']:.2f} | {f['head_ms']:.2f} "
                    f"| **{f['head_ratio']:.2f}** ({f['head_cpu_ratio']:.2f}) | {f['checkout_ms']:.2f} "
                    f"| {f['checkout_ratio']:.2f} ({f['checkout_cpu_ratio']:.2f}) "
                    f"| {f['cold_head_ratio']:.2f} ({f['cold_head_cpu_ratio']:.2f}) "
                    f"| {f['worker_decode_cpu_ms']:.2f} | **{f['head_worker_cpu_ratio']:.2f}** "
                    f"| {f['checkout_worker_cpu_ratio']:.2f} | {f['cold_head_worker_cpu_ratio']:.2f} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its table (for the "Head load" section of RESULTS.md)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks headload", description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default="", help="git revisions to compare with, comma-separated")
    p.add_argument("--backends", default="postgresql,sqlite")
    p.add_argument("--pg-url", default=os.environ.get("EVENTSTORE_TEST_PG_URL"))
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--rounds", type=int, default=41)
    p.add_argument("--pieces", action="store_true", help="the CPU of each piece of this tree's head load")
    p.add_argument(
        "--loads",
        default="head,checkout,cold",
        help="which loads to time each round: head (the decoded blobs kept), checkout (T/2), "
        "cold (the head, the decoded blobs forgotten first: a session's first load in a process)",
    )
    args = p.parse_args(list(argv or []))
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.baseline = [b.strip() for b in args.baseline.split(",") if b.strip()]
    args.loads = {x.strip() for x in args.loads.split(",") if x.strip()}
    if not args.loads <= {"head", "checkout", "cold"}:
        p.error("--loads takes head, checkout, cold")
    if "postgresql" in args.backends and not args.pg_url:
        p.error("PostgreSQL needs --pg-url or EVENTSTORE_TEST_PG_URL (run under scripts/with-postgres)")
    if args.pieces:
        figures = {b: _pieces(b, args) for b in args.backends}
        names = list(next(iter(figures.values())))
        print("| piece | " + " | ".join(f"{b} ms | ÷ baseline" for b in figures) + " |")
        print("|---|" + "--:|--:|" * len(figures))
        for name in names:
            cells = " | ".join(f"{f[name]:.3f} | {f[name] / f[names[0]]:.2f}" for f in figures.values())
            print(f"| {name} | {cells} |")
        return 0
    res = run(args)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(res, indent=2))
    command = "scripts/with-postgres .venv/bin/python -m benchmarks headload" + (
        " " + " ".join(argv) if argv else ""
    )
    print(render(res, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
