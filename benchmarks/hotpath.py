"""The hot path side by side: one event per transaction, and the head load, against a revision.

Run (PostgreSQL comes from scripts/with-postgres, fsync on, default durability)::

    scripts/with-postgres .venv/bin/python -m benchmarks hotpath                  # against 546d9a5
    ... --baseline REV[,REV...] --backends postgresql,sqlite --events 1500 --no-record

The two points of ``benchmarks.store`` that a change of the append or load path moves, with
the landed code of another revision run in the same run: this tree's ``EventStore`` and the
baseline's (extracted from git, each in a worker process of its own on this interpreter, its
tree first on ``sys.path``) and raw psycopg / raw sqlite3 on ``benchmarks.store``'s bare
table (in this process) take turns, block by block, who goes first rotating; each continues
its own growing session (T = 200 workload). A ratio is the median over blocks of raw time ÷
that tree's time. The client CPU (``time.process_time`` of the writing process, its threads
included) does not wait on the disk, so it moves least with the shared machine's load.

Head load: a 17,000-event session (``chat_session(200)``) written by each tree into its
own database, then loads of the head and of random old versions, the two trees and
``orjson.loads`` of the head state's JSON alternating; load ÷ decode is the head figure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson

from benchmarks._common import extract_tree, machine, record_section, split_turns
from benchmarks.store import RawPostgres, RawSQLite, _pg_schema
from eventstore.core.reducer import fold_json
from eventstore.samples import chat_session

__all__ = ["Worker", "databases", "main"]

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Hot path against a revision"
OUT = Path(__file__).parent / "out" / "hotpath.json"
RESULTS = Path(__file__).parent / "RESULTS.md"
#: The project before its second round (feed, catalogue, leases, group commit).
DEFAULT_BASELINE = "546d9a5"

# The worker: one EventStore of whichever tree is first on sys.path, driven by JSON lines
# on stdin; it times its own calls, so the pipe is never in a figure.
_WORKER = r"""
import json, sys, time
from eventstore import EventStore
store = None
for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd["op"]
    if op == "open":
        store = EventStore(cmd["url"])
        store.migrate()
        out = {}
    elif op == "append_each":
        sid = cmd["sid"]
        c0, t0 = time.process_time(), time.perf_counter()
        for a in cmd["actions"]:
            store.append(sid, [a])
        out = {"s": time.perf_counter() - t0, "cpu": time.process_time() - c0}
    elif op == "append_turns":
        for t in cmd["turns"]:
            store.append(cmd["sid"], t)
        out = {}
    elif op == "load":
        t0 = time.perf_counter()
        store.load(cmd["sid"], version=cmd["version"])
        out = {"s": time.perf_counter() - t0}
    elif op == "head":
        out = {"state": store.load(cmd["sid"]).to_json()}
    elif op == "close":
        store.close()
        break
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


class Worker:
    """A tree's EventStore in a process of its own."""

    def __init__(self, tree: Path, script: str = _WORKER) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
            cwd=tree,  # not the working directory: `-c` puts it first on sys.path
        )

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one command; its answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker died during {op!r}")
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close its store and wait for it to end."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(60)


@contextmanager
def databases(backend: str, pg_url: str | None, n: int) -> Iterator[list[str]]:
    """``n`` empty databases (PostgreSQL schemas of one server, or SQLite files)."""
    with ExitStack() as stack:
        if backend == "postgresql":
            yield [stack.enter_context(_pg_schema(pg_url or "")) for _ in range(n)]
        else:
            d = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="es-hotpath-")))
            yield [f"sqlite:///{d / f'db{i}.db'}" for i in range(n)]


def _raw(backend: str, url: str) -> Any:
    if backend == "postgresql":
        return RawPostgres(url)
    return RawSQLite(Path(url.removeprefix("sqlite:///")))


def _append_figures(backend: str, trees: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    actions = chat_session(200, seed=200)[: args.events + 1]
    blocks = [actions[i : i + args.block] for i in range(1, len(actions), args.block)]
    with databases(backend, args.pg_url, len(trees) + 1) as urls:
        raw = _raw(backend, urls[0])
        workers = {name: Worker(tree) for name, tree in trees.items()}
        try:
            for (name, w), url in zip(workers.items(), urls[1:]):
                w.call("open", url=url)
                w.call("append_each", sid="each", actions=actions[:1])
            raw.append_each("each", actions[:1], 0)
            names = ["raw", *workers]
            wall: dict[str, list[float]] = {k: [] for k in names}
            cpu: dict[str, list[float]] = {k: [] for k in names}
            pos = 1
            for i, block in enumerate(blocks):
                for name in names[i % len(names) :] + names[: i % len(names)]:
                    gc.collect()
                    if name == "raw":
                        c0, t0 = time.process_time(), time.perf_counter()
                        raw.append_each("each", block, pos)
                        wall[name].append(time.perf_counter() - t0)
                        cpu[name].append(time.process_time() - c0)
                    else:
                        r = workers[name].call("append_each", sid="each", actions=block)
                        wall[name].append(r["s"])
                        cpu[name].append(r["cpu"])
                pos += len(block)
        finally:
            for w in workers.values():
                w.close()
            raw.close()
    n = sum(len(b) for b in blocks)
    out: dict[str, Any] = {"events": n, "blocks": len(blocks)}
    for name in names:
        ratios = [r / o for r, o in zip(wall["raw"], wall[name])]
        out[name] = {
            "us_per_event": sum(wall[name]) / n * 1e6,
            "cpu_us_per_event": statistics.median(c / len(b) for c, b in zip(cpu[name], blocks)) * 1e6,
            "ratio": statistics.median(ratios),
            "ratio_quartiles": statistics.quantiles(ratios, n=4),
        }
    return out


def _load_figures(backend: str, trees: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    actions = chat_session(200, seed=200)
    turns = split_turns(actions)
    state = fold_json(None, actions)
    blob = orjson.dumps(state)
    rng = random.Random(args.seed)
    versions = [rng.randint(1, len(actions)) for _ in range(args.old_versions)]
    with databases(backend, args.pg_url, len(trees)) as urls:
        workers = {name: Worker(tree) for name, tree in trees.items()}
        try:
            for (name, w), url in zip(workers.items(), urls):
                w.call("open", url=url)
                for i in range(0, len(turns), 20):
                    w.call("append_turns", sid="big", turns=turns[i : i + 20])
                if w.call("head", sid="big")["state"] != json.loads(blob):
                    raise RuntimeError(f"{name}: the head state differs from the fold")
            head: dict[str, list[float]] = {k: [] for k in ["decode", *workers]}
            old: dict[str, list[float]] = {k: [] for k in workers}
            for w in workers.values():  # warm-up: prepared statements, caches
                w.call("load", sid="big", version=None)
            for i in range(args.load_repeats):
                gc.collect()
                t0 = time.perf_counter()
                orjson.loads(blob)
                head["decode"].append(time.perf_counter() - t0)
                k = i % len(workers)
                for name in list(workers)[k:] + list(workers)[:k]:
                    head[name].append(workers[name].call("load", sid="big", version=None)["s"])
            for v in versions:
                for name, w in workers.items():
                    old[name].append(w.call("load", sid="big", version=v)["s"])
        finally:
            for w in workers.values():
                w.close()
    decode = statistics.median(head["decode"])
    out: dict[str, Any] = {"events": len(actions), "state_bytes": len(blob), "decode_ms": decode * 1e3}
    for name in workers:
        h = statistics.median(head[name])
        out[name] = {
            "head_ms": h * 1e3,
            "head_vs_decode": h / decode,
            "old_version_ms": statistics.median(old[name]) * 1e3,
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both figures on every backend; the baseline trees extracted to a temporary directory."""
    res: dict[str, Any] = {
        "benchmark": "hotpath",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(["eventstore", "psycopg", "SQLAlchemy", "pydantic", "orjson"]),
        "baselines": args.baseline,
        "load_before": os.getloadavg(),
        "backends": {},
    }
    with tempfile.TemporaryDirectory(prefix="es-hotpath-tree-") as tmp:
        trees: dict[str, Path] = {}
        for i, rev in enumerate(args.baseline):
            (Path(tmp) / str(i)).mkdir()
            trees[rev] = extract_tree(ROOT, rev, Path(tmp) / str(i))
        trees["this tree"] = ROOT
        for backend in args.backends:
            res["backends"][backend] = {
                "append_event": _append_figures(backend, trees, args),
                "load": _load_figures(backend, trees, args),
            }
            print(backend, json.dumps(res["backends"][backend], indent=1), flush=True)
    res["load_after"] = os.getloadavg()
    return res


def render(res: dict[str, Any], command: str) -> str:
    """The RESULTS.md section of a run."""
    m = res["machine"]
    bases = res["baselines"]
    base = ", ".join(f"`{b}`" for b in bases)
    la = ", ".join(f"{x:.1f}" for x in (*res["load_before"][:1], *res["load_after"][:1]))
    lines = [
        SECTION,
        "",
        f"Command: `{command}` — {res['date']}, baselines {base}; load average {la} (before, after).",
        "",
        f"Machine: `{m['uname']}`, nproc {m['nproc']}, Python {m['python']}; packages {json.dumps(m['packages'])}.",
        "",
        "One event per transaction (T = 200 workload, one growing session each): raw driver, the "
        f"baselines ({base}) and this tree in turns, block by block; ratio = median over blocks of raw "
        "time ÷ the tree's time (quartiles beside it); client CPU = the writing process's CPU per "
        "event. Head load: a 17,000-event session; load ÷ `orjson.loads` of the head state's JSON, "
        "the trees and the decode alternating; old version = median over random versions. A slow "
        "fsync raises every ratio toward 1; the client CPU column does not wait on the disk.",
        "",
        "| backend | writer | µs/event | ratio to raw (quartiles) | client CPU µs/event |",
        "|---|---|--:|--:|--:|",
    ]
    for backend, r in res["backends"].items():
        a = r["append_event"]
        for name in ("raw", *bases, "this tree"):
            f = a[name]
            q = f["ratio_quartiles"]
            lines.append(
                f"| {backend} | {name} | {f['us_per_event']:.0f} | {f['ratio']:.2f} "
                f"({q[0]:.2f} / {q[2]:.2f}) | {f['cpu_us_per_event']:.0f} |"
            )
    lines += [
        "",
        "| backend | tree | events | state KB | decode ms | load head ms | ÷ decode | old version ms |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for backend, r in res["backends"].items():
        ld = r["load"]
        for name in (*bases, "this tree"):
            f = ld[name]
            lines.append(
                f"| {backend} | {name} | {ld['events']:,} | {ld['state_bytes'] / 1024:.0f} | {ld['decode_ms']:.2f} "
                f"| {f['head_ms']:.2f} | {f['head_vs_decode']:.2f} | {f['old_version_ms']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print its section and (unless ``--no-record``) record it."""
    p = argparse.ArgumentParser(prog="python -m benchmarks hotpath", description=__doc__.splitlines()[0])
    p.add_argument(
        "--baseline", default=DEFAULT_BASELINE, help="the git revisions to compare with, comma-separated"
    )
    p.add_argument("--backends", default="postgresql,sqlite")
    p.add_argument("--pg-url", default=os.environ.get("EVENTSTORE_TEST_PG_URL"))
    p.add_argument("--events", type=int, default=1500, help="one-event appends per writer")
    p.add_argument("--block", type=int, default=50, help="appends per block")
    p.add_argument("--load-repeats", type=int, default=31)
    p.add_argument("--old-versions", type=int, default=40)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-record", action="store_true", help="do not rewrite benchmarks/RESULTS.md")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(list(argv or []))
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.baseline = [b.strip() for b in args.baseline.split(",") if b.strip()]
    if "postgresql" in args.backends and not args.pg_url:
        p.error("PostgreSQL needs --pg-url or EVENTSTORE_TEST_PG_URL (run under scripts/with-postgres)")
    res = run(args)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(res, indent=2))
    command = "scripts/with-postgres .venv/bin/python -m benchmarks hotpath" + (
        " " + " ".join(argv) if argv else ""
    )
    section = render(res, command)
    print(section)
    if not args.no_record:
        record_section(args.results, SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
