"""CLI start-up and long logs: how long `eventstore` takes, before and after.

Every figure is the wall time of a fresh process (the way a person runs the command),
median of several runs after one warm-up, for two source trees in the same run: the
baseline (a git revision, extracted to a temporary directory) and the working tree.
Both run on this interpreter, with the tree put first on ``sys.path``.

    .venv/bin/python -m benchmarks startup                       # print the table
    .venv/bin/python -m benchmarks startup --results benchmarks/RESULTS.md

Measured: ``--help``, ``--version``, ``checkout demo@20`` on a SQLite file (the demo
conversation, 51 events), and on a 17,177-event session (``samples.chat_session(200)``)
the whole ``history`` and ``replay`` written to a pipe. Targets: ``--help`` and
``--version`` under 0.25 s, ``checkout`` under 0.5 s, the whole history at least 10×
faster than the baseline.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks._common import extract_tree, machine, record_section

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTION = "## CLI start-up and long logs"
#: The landed code before the CLI's start-up and output work.
DEFAULT_BASELINE = "546d9a5"

_RUN = "import sys; sys.argv[0] = 'eventstore'; from eventstore_cli.app import main; sys.exit(main())"


def _extract(revision: str, into: Path) -> Path:
    """The source tree of ``revision`` (eventstore, cli, migrations) under ``into``."""
    return extract_tree(ROOT, revision, into)


def _timed(tree: Path, args: list[str], cwd: Path) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run of the program from ``tree``."""
    env = {k: v for k, v in os.environ.items() if k != "EVENTSTORE_URL"}
    env["PYTHONPATH"] = f"{tree}{os.pathsep}{tree / 'cli'}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", _RUN, *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"{tree}: eventstore {' '.join(args)} failed: {r.stderr.decode()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _pair(before: Path | None, after: Path, args: list[str], cwd: Path, repeats: int) -> dict[str, Any]:
    """Medians for both trees, their runs alternating so that both see the same load."""
    trees = [t for t in (before, after) if t is not None]
    for tree in trees:
        _timed(tree, args, cwd)  # warm-up: file caches, .pyc
    runs: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
    for i in range(repeats):
        for tree in trees if i % 2 == 0 else trees[::-1]:
            runs[tree].append(_timed(tree, args, cwd))

    def med(tree: Path | None, k: int) -> float | None:
        return None if tree is None else statistics.median(x[k] for x in runs[tree])

    return {
        "before_s": med(before, 0),
        "after_s": med(after, 0),
        "before_cpu_s": med(before, 1),
        "after_cpu_s": med(after, 1),
    }


def _prepare(work: Path) -> tuple[str, str]:
    """Two SQLite files: the demo conversation, and a 17k-event session."""
    from eventstore import EventStore, samples

    small = f"sqlite:///{work / 'demo.db'}"
    big = f"sqlite:///{work / 'big.db'}"
    with EventStore(small) as store:
        store.migrate()
        store.append("demo", samples.demo_conversation())
    with EventStore(big) as store:
        store.migrate()
        actions = samples.chat_session(200)
        for i in range(0, len(actions), 1000):
            store.append("big", actions[i : i + 1000])
    return small, big


def _byte_compile(tree: Path) -> None:
    """Write the bytecode cache of a tree's packages, as ``pip install`` does.

    Without it, an environment with ``PYTHONDONTWRITEBYTECODE`` set (this machine's) would
    recompile every module of the package on every command, and the figures would measure
    the compiler rather than the start-up a user of an installed package sees.
    """
    for package in (tree / "eventstore", tree / "cli" / "eventstore_cli"):
        if not compileall.compile_dir(str(package), quiet=1):
            raise RuntimeError(f"cannot byte-compile {package}")


def measure(baseline: str, repeats: int, long_repeats: int) -> dict[str, Any]:
    """Run every case on both trees; the figures in seconds."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="es-startup-") as tmp:
        work = Path(tmp)
        before = _extract(baseline, work)
        for tree in (before, ROOT):
            _byte_compile(tree)
        small, big = _prepare(work)
        cases: list[tuple[str, list[str], int, bool]] = [
            ("eventstore --help", ["--help"], repeats, True),
            ("eventstore --version", ["--version"], repeats, False),
            ("checkout demo@20 (SQLite)", ["--db", small, "checkout", "demo@20"], repeats, True),
            ("history, 17,177 events, piped", ["--db", big, "history", "big"], long_repeats, True),
            ("replay, 17,177 events, piped", ["--db", big, "replay", "big"], long_repeats, True),
        ]
        rows: list[dict[str, Any]] = []
        for name, args, n, in_baseline in cases:
            row = {"case": name, **_pair(before if in_baseline else None, ROOT, args, work, n)}
            rows.append(row)
            print(name, {k: v if v is None else round(v, 3) for k, v in row.items() if k != "case"}, flush=True)
    return {"baseline": baseline, "rows": rows, "load": [load_before, os.getloadavg()[0]]}


TARGETS: dict[str, tuple[str, Callable[[dict[str, Any]], bool]]] = {
    "eventstore --help": ("under 0.25 s", lambda r: r["after_cpu_s"] < 0.25),
    "eventstore --version": ("under 0.25 s", lambda r: r["after_cpu_s"] < 0.25),
    "checkout demo@20 (SQLite)": ("under 0.5 s", lambda r: r["after_cpu_s"] < 0.5),
    "history, 17,177 events, piped": ("≥ 10× faster", lambda r: r["before_s"] / r["after_s"] >= 10),
}


def markdown(result: dict[str, Any], argv: Sequence[str]) -> str:
    """The results as a RESULTS.md section."""
    m = machine(["eventstore", "typer", "rich", "sqlalchemy", "pydantic"])
    lines = [
        SECTION,
        "",
        f"Command: `{' '.join(['.venv/bin/python -m benchmarks startup', *argv])}` — "
        f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}",
        "",
        f"Machine: `{m['uname']}`, nproc {m['nproc']}, Python {m['python']}, packages {json.dumps(m['packages'])}.",
        "",
        f"A fresh process per run, both trees byte-compiled first (as `pip install` leaves a package), medians after a warm-up, runs of the two trees alternating; baseline = "
        f"revision `{result['baseline']}` (the landed code before this work) run from a temporary copy on the same "
        "interpreter, in the same run. Wall time is what a person waits; CPU time (user + system of the process) "
        "is what the command costs whatever else the shared machine runs, so the start-up targets are judged "
        "on it; the long-log target on the wall-time ratio.",
        "",
        "| case | before, wall (s) | after, wall (s) | before, CPU (s) | after, CPU (s) | before ÷ after (wall) "
        "| target | met |",
        "|---|---:|---:|---:|---:|---:|---|:---:|",
    ]
    for r in result["rows"]:
        def fmt(v: float | None) -> str:
            return "–" if v is None else f"{v:.3f}"

        ratio = "–" if r["before_s"] is None else f"{r['before_s'] / r['after_s']:.1f}×"
        target, ok = TARGETS.get(r["case"], ("", None))
        met = "" if ok is None else ("yes" if ok(r) else "**no**")
        lines.append(
            f"| {r['case']} | {fmt(r['before_s'])} | {fmt(r['after_s'])} | {fmt(r['before_cpu_s'])} "
            f"| {fmt(r['after_cpu_s'])} | {ratio} | {target} | {met} |"
        )
    lines += [
        "",
        "`--version` did not exist before. The long-log cases print every event (output to a pipe is never paged; "
        "on a terminal `history` shows 100 events unless given `--all`).",
        "",
        f"Load average (1 min) at the start and end of the run: {result['load'][0]:.1f} and "
        f"{result['load'][1]:.1f} on {m['nproc']} CPUs; wall times of short commands grow with it. A `checkout` is "
        "now almost all imports the command cannot skip (SQLAlchemy, pydantic, the library's modules, Typer); "
        "`--help` and `--version` load none of them. `replay` is bounded by the library computing what each "
        "step changed, not by printing.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the markdown section, optionally record it; 0 when every target is met."""
    args = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision to compare with")
    p.add_argument("--repeats", type=int, default=7, help="runs per short case")
    p.add_argument("--long-repeats", type=int, default=3, help="runs per long-log case")
    p.add_argument("--results", type=Path, default=None, help="also record the section in this RESULTS.md")
    ns = p.parse_args(args)
    result = measure(ns.baseline, ns.repeats, ns.long_repeats)
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "startup.json").write_text(json.dumps(result, indent=2))
    section = markdown(result, args)
    print(section)
    if ns.results is not None:
        record_section(ns.results, SECTION, section)
    ok = all(TARGETS[r["case"]][1](r) for r in result["rows"] if r["case"] in TARGETS)
    return 0 if ok else 1
