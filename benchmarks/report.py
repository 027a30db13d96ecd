"""Audit report benchmark: how long does ``store.report`` take on long sessions?

Run::

    .venv/bin/python -m benchmarks report                     # 1k and 20k events, SQLite
    .venv/bin/python -m benchmarks report --results benchmarks/RESULTS.md   # also record

Workload: ``eventstore.samples.chat_session`` (≈ 86 events per turn: a user message, two
streamed assistant messages, one tool call) cut to exactly 1,000 and 20,000 events and
appended to a fresh SQLite database in batches of 1,000. Wall time (what a person waits
for), median (and best) of ``--repeats`` runs after one warm-up, measured in the same run:

- **turn view** — ``store.turns(session)``: read every event, fold it, group the turns.
  The baseline: the least any per-turn report must do.
- **verify** — ``store.verify(session)``: the hash chain and snapshots, which the report
  runs to show its result.
- **report** — ``store.report(session)``: all of the above plus the HTML page.

Target: the 20k-event report in under 3 s. When headless Chromium and Selenium are
installed (``scripts/ensure-chromium``), the page is also opened from a file (twice: the
second load is timed) and the time from navigation to the load event is recorded, to show
the page stays usable.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import machine, record_section, run_times
from eventstore import EventStore
from eventstore.samples import chat_session

__all__ = ["main", "measure", "fill_session"]

SECTION = "## Audit report"
OUT = Path(__file__).parent / "out" / "report.json"
TARGET_SECONDS = 3.0
SIZES = (1_000, 20_000)
_CHROMIUM = "/usr/bin/chromium"
_CHROMEDRIVER = "/usr/bin/chromedriver"


def fill_session(store: EventStore, session: str, n: int) -> None:
    """Append the first ``n`` events of the sample chat workload to ``session``, 1,000 at a time."""
    actions = chat_session(math.ceil(n / 86) + 1)[:n]
    head = 0
    for i in range(0, n, 1000):
        head = store.append(session, actions[i : i + 1000], expected_version=head).version


def _stats(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "best": min(samples)}


def _browser_load_seconds(pages: dict[int, Path]) -> dict[int, float] | None:
    """Seconds from navigation start to the load event of each page, or None without a browser."""
    if not (os.path.exists(_CHROMIUM) and os.path.exists(_CHROMEDRIVER)):
        return None
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = _CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=_CHROMEDRIVER), options=options)
    try:
        out = {}
        for n, path in pages.items():
            driver.get(path.as_uri())  # warm-up: the first load pays the browser's cold start
            driver.get(path.as_uri())
            ms = driver.execute_script(
                "const t = performance.getEntriesByType('navigation')[0];"
                "return t.loadEventEnd - t.startTime;"
            )
            out[n] = float(ms) / 1000
        return out
    finally:
        driver.quit()


def measure(repeats: int, sizes: Sequence[int] = SIZES) -> dict[str, Any]:
    """Fill one session per size and time the turn view, verify and the report on each."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, EventStore(f"sqlite:///{tmp}/bench.db") as store:
        store.migrate()
        pages: dict[int, Path] = {}
        for n in sizes:
            session = f"s{n}"
            fill_session(store, session, n)
            page = store.report(session)
            pages[n] = Path(tmp) / f"{session}.html"
            pages[n].write_text(page, encoding="utf-8")
            warm = 1
            turns = run_times(lambda: store.turns(session), repeats, warm)
            verify = run_times(lambda: store.verify(session), repeats, warm)
            report = run_times(lambda: store.report(session), repeats, warm)
            rows.append(
                {
                    "events": n,
                    "turns": len(store.turns(session)),
                    "page_bytes": len(page.encode()),
                    "turn_view": _stats(turns),
                    "verify": _stats(verify),
                    "report": _stats(report),
                    "ratio": statistics.median(report) / statistics.median(turns),
                }
            )
        loads = _browser_load_seconds(pages)
    for row in rows:
        row["browser_load"] = None if loads is None else loads[row["events"]]
    return {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(("eventstore", "sqlalchemy", "orjson", "selenium")),
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
        f"wall time, median (best) of {r['repeats']} runs after a warm-up.",
        "",
        "| events | turns | page | turn view (baseline) | verify | report | report ÷ turn view | "
        "page load in Chromium |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        load = "—" if row["browser_load"] is None else _ms(row["browser_load"])
        lines.append(
            f"| {row['events']:,} | {row['turns']} | {row['page_bytes'] / 1e6:.2f} MB | "
            f"{_ms(row['turn_view']['median'])} ({_ms(row['turn_view']['best'])}) | "
            f"{_ms(row['verify']['median'])} | "
            f"{_ms(row['report']['median'])} ({_ms(row['report']['best'])}) | "
            f"{row['ratio']:.2f} | {load} |"
        )
    big = r["rows"][-1]
    met = "met" if big["report"]["median"] < TARGET_SECONDS else "**not met**"
    lines += [
        "",
        f"Target: a {big['events']:,}-event report in under {TARGET_SECONDS:.0f} s — "
        f"{_ms(big['report']['median'])}: {met}.",
        "",
        "Reading: the turn view is the floor (every event read and folded once); the report "
        "adds `verify` (the whole hash chain is recomputed so the page can say whether the "
        "record checks out) and the HTML itself. With more than 40 turns the page opens with "
        "every turn collapsed to its one-line summary.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the report benchmark; print the markdown section and write ``benchmarks/out/report.json``.

    Returns:
        0 when the largest session renders within the target, 1 otherwise.
    """
    p = argparse.ArgumentParser(prog="python -m benchmarks report", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure")
    p.add_argument("--results", type=Path, default=None, help="also record the section in this RESULTS.md")
    a = p.parse_args(argv)
    r = measure(a.repeats)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(r, indent=2))
    command = "python -m benchmarks report" + (f" --repeats {a.repeats}" if a.repeats != 5 else "")
    if a.results is not None:
        command += f" --results {a.results}"
    text = markdown(r, command)
    print(text)
    if a.results is not None:
        record_section(a.results, SECTION, text)
    return 0 if r["rows"][-1]["report"]["median"] < TARGET_SECONDS else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
