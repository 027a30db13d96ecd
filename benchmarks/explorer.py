"""Explorer benchmark: how long does a page of ``eventstore ui`` take on a long session?

Run::

    .venv/bin/python -m benchmarks explorer                     # 1k and 20k events, SQLite
    .venv/bin/python -m benchmarks explorer --results benchmarks/RESULTS.md   # also record

Workload: ``eventstore.samples.chat_session`` (≈ 86 events per turn) cut to exactly 1,000
and 20,000 events in a fresh SQLite database, the same sessions as the report benchmark.
Each figure is the wall time of one HTTP request through the whole application
(Starlette's in-process test client: routing, rendering, headers), median (and best) of
``--repeats`` runs after a warm-up:

- **load** — ``store.load(session)``: the head state (a snapshot plus the tail). The
  baseline: the least any page showing the session must do.
- **session page** — ``GET /sessions/{id}``: facts, branch tree, scrubber and the turn view
  at the head (the last turn in full, the earlier ones folded).
- **scrub step** — ``GET /sessions/{id}/view?v=N``, the fragment the scrubber fetches, for
  versions spread over the session (each run a different one).
- **history page** — ``GET /sessions/{id}/history?after=N``: 100 events.
- **verify** — ``GET /sessions/{id}/verify``, the first time for a head (the page fetches it
  separately, and later pages at that head show the cached result).

Target: the 20k-event session page and a scrub step each in under 300 ms.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import machine, record_section, run_times
from benchmarks.report import fill_session
from eventstore import EventStore

__all__ = ["main", "measure"]

SECTION = "## Explorer"
OUT = Path(__file__).parent / "out" / "explorer.json"
TARGET_SECONDS = 0.3
SIZES = (1_000, 20_000)


def _stats(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "best": min(samples)}


def measure(repeats: int, sizes: Sequence[int] = SIZES) -> dict[str, Any]:
    """Fill one session per size and time the explorer's requests on each."""
    from starlette.testclient import TestClient

    from eventstore.explorer import create_app

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, EventStore(f"sqlite:///{tmp}/bench.db") as store:
        store.migrate()
        client = TestClient(create_app(store))

        def get(url: str) -> int:
            r = client.get(url)
            assert r.status_code == 200, (url, r.status_code)
            return len(r.content)

        for n in sizes:
            session = f"s{n}"
            fill_session(store, session, n)
            page_bytes = get(f"/sessions/{session}")
            steps = itertools.cycle(range(n // 7, n, n // 7))
            afters = itertools.cycle(range(0, n - 100, n // 5))
            load = run_times(lambda: store.load(session), repeats, 1)
            page = run_times(lambda: get(f"/sessions/{session}"), repeats, 1)
            step = run_times(lambda: get(f"/sessions/{session}/view?v={next(steps)}"), repeats, 1)
            history = run_times(lambda: get(f"/sessions/{session}/history?after={next(afters)}"), repeats, 1)
            verify = run_times(lambda: get(f"/sessions/{session}/verify?head={n}"), 1, 0)
            rows.append(
                {
                    "events": n,
                    "page_bytes": page_bytes,
                    "load": _stats(load),
                    "page": _stats(page),
                    "step": _stats(step),
                    "history": _stats(history),
                    "verify": verify[0],
                    "page_ratio": statistics.median(page) / statistics.median(load),
                    "step_ratio": statistics.median(step) / statistics.median(load),
                }
            )
    return {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(("eventstore", "sqlalchemy", "starlette", "orjson")),
        "repeats": repeats,
        "rows": rows,
    }


def _ms(s: float) -> str:
    return f"{s * 1000:,.0f} ms" if s >= 0.1 else f"{s * 1000:.1f} ms"


def markdown(r: dict[str, Any], command: str) -> str:
    """The results as the RESULTS.md section."""
    m = r["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    lines = [
        SECTION,
        "",
        f"Measured {r['when']} with `{command}` on {m['uname']} ({m['nproc']} CPUs), "
        f"Python {m['python']}, {packages}. SQLite; workload `chat_session` cut to N events; "
        f"one HTTP request through the application (in-process client), wall time, median "
        f"(best) of {r['repeats']} runs after a warm-up.",
        "",
        "| events | page | load (baseline) | session page | ÷ load | scrub step | ÷ load | history page "
        "| verify (first, then cached) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['events']:,} | {row['page_bytes'] / 1e3:.0f} kB | "
            f"{_ms(row['load']['median'])} ({_ms(row['load']['best'])}) | "
            f"{_ms(row['page']['median'])} ({_ms(row['page']['best'])}) | {row['page_ratio']:.1f} | "
            f"{_ms(row['step']['median'])} ({_ms(row['step']['best'])}) | {row['step_ratio']:.1f} | "
            f"{_ms(row['history']['median'])} | {_ms(row['verify'])} |"
        )
    big = r["rows"][-1]
    worst = max(big["page"]["median"], big["step"]["median"])
    met = "met" if worst < TARGET_SECONDS else "**not met**"
    lines += [
        "",
        f"Target: the {big['events']:,}-event session page and a scrub step each under "
        f"{TARGET_SECONDS * 1000:.0f} ms — {_ms(big['page']['median'])} and "
        f"{_ms(big['step']['median'])}: {met}.",
        "",
        "Reading: a page reads the state at one version (a snapshot and its tail), the events "
        "of the one turn that version falls in, and the session list for the branch tree; "
        "what grows with the session is the earlier turns' messages, rendered folded. The "
        "history reads one page of events. Only verify reads the whole log, once per head.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the explorer benchmark; print the markdown section and write ``benchmarks/out/explorer.json``.

    Returns:
        0 when the largest session's page and scrub step are within the target, 1 otherwise.
    """
    p = argparse.ArgumentParser(prog="python -m benchmarks explorer", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7, help="timed runs per figure")
    p.add_argument("--results", type=Path, default=None, help="also record the section in this RESULTS.md")
    a = p.parse_args(argv)
    r = measure(a.repeats)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(r, indent=2))
    command = "python -m benchmarks explorer" + (f" --repeats {a.repeats}" if a.repeats != 7 else "")
    if a.results is not None:
        command += f" --results {a.results}"
    text = markdown(r, command)
    print(text)
    if a.results is not None:
        record_section(a.results, SECTION, text)
    big = r["rows"][-1]
    return 0 if max(big["page"]["median"], big["step"]["median"]) < TARGET_SECONDS else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
