"""What sealing costs a writer: one writer appending whole turns flat out, sealing on and off.

``python -m benchmarks seal_cost [--backend sqlite|postgresql] [--turns 50] [--rounds 5]
[--configs rows,default,eager]`` writes ``chat_session(T)`` one append per turn, as fast as
it can, into a fresh session of one store per configuration, the configurations taking
turns round after round (so a change in the machine's load falls on all of them alike):

- ``rows``: ``seal=False``, every event a row (the baseline of every ratio);
- ``default``: ``seal=True``, the default :class:`~eventstore.SealPolicy` (the background
  sealer yields to the appends, within its bounds);
- ``eager``: ``SealPolicy(quiet=0)``: the worker seals as soon as a turn closes (how the
  sealer worked before the policy).

Per configuration, medians over the rounds: wall ms per appended turn, the process's CPU
ms per turn (the writer's thread and the sealer's together), the closed turns still rows
when the last append returned, and how long the store then took to seal them (the writer
idle). Also, with ``--seal-cpu``: the client CPU of ``store.seal()`` per sealed turn
against that of appending it (a ``seal=False`` store, sealed after the writes).

PostgreSQL needs ``scripts/with-postgres``. Writes ``benchmarks/out/seal_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from benchmarks._common import split_turns
from eventstore import EventStore
from eventstore.samples import chat_session

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
_WAITING = (
    "SELECT count(*) FROM (SELECT DISTINCT e.session_pk, e.turn FROM events e "
    "JOIN sessions s ON s.pk = e.session_pk WHERE e.turn < s.head_turn AND s.id = :id) t"
)


def _seal_option(config: str) -> Any:
    if config == "rows":
        return False
    if config == "default":
        return True
    from eventstore import SealPolicy

    return SealPolicy(quiet=0)


def _waiting(engine: Any, session: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(_WAITING), {"id": session}).scalar_one())


def _round(url: str, config: str, turns: list[list[Any]], session: str) -> dict[str, float]:
    store = EventStore(url, seal=_seal_option(config))
    engine = create_engine(url)
    try:
        store.migrate()
        c0, w0 = time.process_time(), time.perf_counter()
        for turn in turns:
            store.append(session, turn)
        c1, w1 = time.process_time(), time.perf_counter()
        left = _waiting(engine, session)
        drain = 0.0
        if config != "rows":
            deadline = w1 + 120
            while _waiting(engine, session) and time.perf_counter() < deadline:
                time.sleep(0.02)  # paces the polling only
            drain = time.perf_counter() - w1
        n = len(turns)
        return {
            "wall_ms": 1e3 * (w1 - w0) / n,
            "cpu_ms": 1e3 * (c1 - c0) / n,
            "left": float(left),
            "drain_s": drain,
        }
    finally:
        store.close()
        engine.dispose()


def _seal_cpu(url: str, turns: list[list[Any]], session: str) -> dict[str, float]:
    store = EventStore(url, seal=False)
    try:
        store.migrate()
        c0 = time.process_time()
        for turn in turns:
            store.append(session, turn)
        c1 = time.process_time()
        sealed = store.seal(session)
        c2 = time.process_time()
        return {"append_ms": 1e3 * (c1 - c0) / len(turns), "seal_ms": 1e3 * (c2 - c1) / max(sealed, 1)}
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks seal_cost", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    p.add_argument("--turns", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--configs", default="rows,default,eager")
    p.add_argument("--seal-cpu", action="store_true", help="also client CPU per sealed turn vs appended")
    p.add_argument("--json", default=str(HERE / "out" / "seal_cost.json"))
    args = p.parse_args(argv)
    if args.backend == "postgresql":
        url = os.environ.get("EVENTSTORE_TEST_PG_URL") or os.environ["EVENTSTORE_BENCH_PG_URL"]
    else:
        url = f"sqlite:///{tempfile.mkdtemp(prefix='seal-cost-')}/events.db"
    turns = split_turns(chat_session(args.turns, seed=7))
    configs = args.configs.split(",")
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in configs + (["seal-cpu"] if args.seal_cpu else [])}
    tag = f"{os.getpid()}-{int(time.time())}"
    for r in range(args.rounds):
        for c in configs:
            runs[c].append(_round(url, c, turns, f"{c}-{tag}-{r}"))
        if args.seal_cpu:
            runs["seal-cpu"].append(_seal_cpu(url, turns, f"cpu-{tag}-{r}"))
    medians = {c: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for c, rs in runs.items() if rs}
    base = medians.get("rows")
    print(f"{args.backend}, chat_session({args.turns}), {args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    for c in configs:
        m = medians[c]
        rel = f"  ({base['wall_ms'] / m['wall_ms']:.2f}x the rows' turns/s)" if base and c != "rows" else ""
        print(
            f"  {c:8} wall {m['wall_ms']:6.2f} ms/turn  cpu {m['cpu_ms']:6.2f} ms/turn  "
            f"left {m['left']:4.0f} turns  drain {m['drain_s']:5.2f} s{rel}"
        )
    if args.seal_cpu:
        m = medians["seal-cpu"]
        print(f"  client CPU: append {m['append_ms']:.2f} ms/turn, seal {m['seal_ms']:.2f} ms/turn "
              f"({m['seal_ms'] / m['append_ms']:.2f}x)")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "machine": platform.platform(), "runs": runs, "medians": medians}, indent=1))
    return 0
