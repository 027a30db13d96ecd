"""Two revisions side by side: the store, streaming, feed and compare benchmarks of each, alternating.

Run it from this checkout's virtualenv (it needs no PostgreSQL itself)::

    .venv/bin/python -m benchmarks sidebyside --before 3bcf4b1 --after HEAD
    ... --only store,feed --passes 2 --no-record --noise 0.25
    ... --earlier benchmarks/out/sidebyside/STAMP/sidebyside.json   # an earlier run below
    ... --notes NOTES.md       # what the runs showed, above the tables
    ... --from-json LATEST.json [EARLIER.json ...]    # render saved runs only

``--before`` and ``--after`` each name a revision or a directory holding a checkout. A
revision that is this checkout's HEAD runs here; any other gets a detached git worktree of
its own under ``--trees`` (``make install`` gives it its virtualenv). Each benchmark runs in
its tree's own checkout, with its tree's virtualenv, under its tree's own
``scripts/with-postgres`` (a fresh server per run), so each side measures its own code with
its own copy of the benchmark; the two sides alternate benchmark by benchmark, who goes first
alternating too. No run writes ``RESULTS.md`` or the figures: the options below keep them
out, and the figures are read back from each run's JSON.

Absolute times on a shared machine are noise; what compares across runs is each figure the
benchmark itself reports as a ratio against its raw baseline (raw psycopg, raw sqlite3, or
the statement without the feed) measured in the same run. The table puts those ratios side
by side: before, after, after ÷ before, and marks a figure that moved the bad way by more
than ``--noise``. Feed latencies have no same-run baseline: they are listed for information.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import record_section

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
SECTION = "## Before and after the layout redesign"
OUT = HERE / "out" / "sidebyside"

#: Each benchmark's options: short runs (one pass of all four for both trees takes about 9
#: minutes on the shared 2-core machine at a load average of 5, 15 at 15), and what keeps
#: each from writing RESULTS.md or the figures.
#: ``{json}`` is where compare writes its JSON; the others write ``benchmarks/out/NAME.json``.
OPTIONS: dict[str, list[str]] = {
    "store": ["--quick", "--no-record"],
    "streaming": ["--seconds", "1.5", "--writers", "1,16", "--kill-seconds", "1", "--no-record"],
    "feed": ["--quick", "--no-record"],
    "compare": [
        "--quick", "--targets", "raw,es-pg,es-sqlite", "--turns", "50", "--writers", "4",
        "--cell-seconds", "1.5", "--json", "{json}", "--results", "", "--figures", "",
    ],
}
BENCHES = tuple(OPTIONS)

HIGHER, LOWER, INFO = "higher", "lower", "info"

#: ``--unsealed``: run ``python -m benchmarks`` with every engine made with ``seal=False``
#: (where the tree's Engine takes ``seal``; a no-op elsewhere), to tell what sealed segments
#: cost from what the rest of the change does.
UNSEALED = """
import importlib, inspect, runpy, sys
for name in ("eventstore.engine.engine", "eventstore.engine"):
    try:
        Engine = importlib.import_module(name).Engine
        break
    except (ImportError, AttributeError):
        continue
init = Engine.__init__
if "seal" in inspect.signature(init).parameters:
    def unsealed(self, *args, **kwargs):
        kwargs["seal"] = False
        init(self, *args, **kwargs)
    Engine.__init__ = unsealed
runpy.run_module("benchmarks", run_name="__main__", alter_sys=True)
"""

#: One figure of one run: (label, value, which way is better).
Figure = tuple[str, float | None, str]


# -- the trees ------------------------------------------------------------------------------


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def resolve_tree(spec: str, trees: Path) -> Path:
    """The checkout that runs ``spec``: a directory as it is, this checkout for its own
    HEAD, else a detached worktree of the revision under ``trees`` (made on first use)."""
    if Path(spec).is_dir():
        tree = Path(spec).resolve()
    else:
        sha = _git("rev-parse", "--verify", f"{spec}^{{commit}}")
        if sha == _git("rev-parse", "HEAD"):
            tree = ROOT
        else:
            tree = (trees / sha[:7]).resolve()
            if not tree.exists():
                trees.mkdir(parents=True, exist_ok=True)
                _git("worktree", "add", "--detach", str(tree), sha)
    if not (tree / "scripts" / "with-postgres").exists():
        raise SystemExit(f"{tree}: no scripts/with-postgres; not a checkout of this project")
    # Every time: make reinstalls only when pyproject.toml is newer than the venv's stamp
    # (a revision that adds a dependency).
    subprocess.run(["make", "install"], cwd=tree, check=True, stdout=subprocess.DEVNULL)
    return tree


def describe(tree: Path) -> dict[str, Any]:
    """Commit, subject and whether the library differs from the commit (uncommitted changes)."""
    library = ("eventstore", "migrations", "pyproject.toml")
    dirty = _git("status", "--porcelain", "--", *library, cwd=tree)
    return {
        "path": str(tree),
        "commit": _git("rev-parse", "--short", "HEAD", cwd=tree),
        # The newest commit that changed the library: a branch of benchmark commits on top
        # of a revision runs that revision's library.
        "library": _git("log", "-1", "--format=%h", "--", *library, cwd=tree),
        "subject": _git("log", "-1", "--format=%s", "--", *library, cwd=tree),
        "dirty": bool(dirty),
    }


# -- one run --------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    """This environment without the calling virtualenv: each tree runs its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT / ".venv"))
    )
    return env


def run_one(
    tree: Path, bench: str, side: str, n: int, out: Path, timeout: float, unsealed: bool = False
) -> dict[str, Any]:
    """``python -m benchmarks BENCH`` in ``tree`` under its own scripts/with-postgres: the
    record of pass ``n`` of ``side``, with the benchmark's JSON as ``result`` if it succeeded."""
    tag = f"p{n}-{side}"
    json_path = out / f"{tag}-{bench}.json"
    default_json = tree / "benchmarks" / "out" / f"{bench}.json"
    if bench != "compare" and default_json.exists():
        default_json.unlink()  # never read a stale result
    opts = [o.replace("{json}", str(json_path)) for o in OPTIONS[bench]]
    cmd = [str(tree / "scripts" / "with-postgres"), str(tree / ".venv" / "bin" / "python"),
           *(["-c", UNSEALED] if unsealed else ["-m", "benchmarks"]), bench, *opts]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    with (out / f"{tag}-{bench}.log").open("w") as log:
        try:
            proc = subprocess.run(cmd, cwd=tree, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout, check=False)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = -1
    rec: dict[str, Any] = {
        "bench": bench,
        "side": side,
        "pass": n,
        "command": " ".join(cmd[1:]).replace(str(tree) + "/", "").replace(UNSEALED, "UNSEALED"),
        "seconds": time.perf_counter() - t0,
        "load_start": load0[0],
        "load_end": os.getloadavg()[0],
        "exit": code,
    }
    if bench != "compare" and default_json.exists():
        shutil.copy(default_json, json_path)
    if code == 0 and json_path.exists():
        rec["result"] = json.loads(json_path.read_text())
    else:
        rec["error"] = f"exit {code}; see {out / f'{tag}-{bench}.log'}"
    return rec


# -- the figures ----------------------------------------------------------------------------


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or b in (None, 0) else a / b  # type: ignore[operator]


def store_figures(r: dict[str, Any]) -> list[Figure]:
    out: list[Figure] = []
    for backend, res in r["backends"].items():
        b = "PG" if backend == "postgresql" else "SQLite"
        out += [
            (f"{b} one-event append, throughput × raw", res["append_event"]["throughput_ratio"], HIGHER),
            (f"{b} one-turn append, throughput × raw", res["append_turn"]["throughput_ratio"], HIGHER),
        ]
        by_turns = res["default"]["by_turns"]
        for t, f in by_turns.items():
            out.append((f"{b} head load T={t}, time ÷ raw", f["load_vs_raw"], LOWER))
        if "200" in by_turns:
            out.append((f"{b} bytes/event T=200 ÷ raw", by_turns["200"]["size_ratio"], LOWER))
    return out


def streaming_figures(r: dict[str, Any]) -> list[Figure]:
    runs = r["runs"]

    def row(target: str, w: int, mode: str) -> dict[str, Any]:
        return next(x for x in runs if x["target"] == target and x["writers"] == w and x["mode"] == mode)

    out: list[Figure] = []
    for w in sorted({x["writers"] for x in runs}):
        raw_s, raw_p = row("raw", w, "saturating"), row("raw", w, "paced")
        for t in ("append", "turn", "aturn"):
            out.append((f"W={w} {t} saturating events/s × raw",
                        _div(row(t, w, "saturating")["events_per_s"], raw_s["events_per_s"]), HIGHER))
        for t in ("append", "turn", "aturn"):
            out.append((f"W={w} {t} paced client CPU/event ÷ raw",
                        _div(row(t, w, "paced")["cpu_ms_per_event"], raw_p["cpu_ms_per_event"]), LOWER))
        for t in ("append", "turn", "aturn"):
            out.append((f"W={w} {t} paced p50 write→durable ÷ raw",
                        _div(row(t, w, "paced").get("p50_ms"), raw_p.get("p50_ms")), LOWER))
    return out


def feed_figures(r: dict[str, Any]) -> list[Figure]:
    out: list[Figure] = []
    for b, name in (("postgresql", "PG"), ("sqlite", "SQLite")):
        res = r[b]
        for key in ("throughput_fresh", "throughput_analyzed", "throughput_vacuumed", "throughput"):
            if key in res:
                state = key.removeprefix("throughput").lstrip("_") or "read"
                out.append((f"{name} feed read ({state}) throughput × raw paging", res[key]["ratio"], HIGHER))
        out += [
            (f"{name} append statement with the feed ÷ without", res["append"]["all_ratio"], LOWER),
            (f"{name} append statement, feed storage only ÷ without", res["append"]["storage_ratio"], LOWER),
        ]
        for x in res["latency"]:
            who = "idle xact elsewhere" if x.get("idle_elsewhere") else (
                "other process" if x["elsewhere"] else "same store")
            out.append((f"{name} W={x['writers']} commit→follower p50 ms ({who})", x["p50_ms"], INFO))
    return out


def compare_figures(r: dict[str, Any]) -> list[Figure]:
    targets = r["targets"]
    raw = targets.get("raw", {})
    out: list[Figure] = []
    for key in ("es-pg", "es-sqlite"):
        e = targets.get(key)
        if not e or "sizes" not in e:
            continue
        for t, s in e["sizes"].items():
            rs = raw.get("sizes", {}).get(t, {})
            if "error" in s or "skipped" in s:
                continue
            out += [
                (f"{key} T={t} per-turn append × raw", s.get("per_turn_ratio"), HIGHER),
                (f"{key} T={t} per-event append × raw", s.get("per_event_ratio"), HIGHER),
                (f"{key} T={t} load head ÷ raw", _div(s.get("load_head_ms"), rs.get("load_head_ms")), LOWER),
                (f"{key} T={t} load old version ÷ raw", _div(s.get("load_old_ms"), rs.get("load_old_ms")), LOWER),
                (f"{key} T={t} full history ÷ raw", _div(s.get("history_ms"), rs.get("history_ms")), LOWER),
                (f"{key} T={t} bytes/event ÷ raw", _div(s.get("bytes_per_event"), rs.get("bytes_per_event")), LOWER),
            ]
        for w, c in e.get("concurrency", {}).items():
            if "error" in c:
                continue
            out += [
                (f"{key} W={w} writers events/s × raw", _div(c.get("eps"), c.get("raw_eps")), HIGHER),
                (f"{key} W={w} writers p50 ÷ raw", _div(c.get("p50_ms"), c.get("raw_p50_ms")), LOWER),
            ]
    return out


FIGURES: dict[str, Callable[[dict[str, Any]], list[Figure]]] = {
    "store": store_figures,
    "streaming": streaming_figures,
    "feed": feed_figures,
    "compare": compare_figures,
}


# -- the table ------------------------------------------------------------------------------


def _figures_of(runs: list[dict[str, Any]], bench: str, side: str) -> dict[str, list[float]]:
    """Every value of each figure of one side, over the passes (a failed run gives none)."""
    values: dict[str, list[float]] = {}
    for rec in runs:
        if rec["bench"] == bench and rec["side"] == side and "result" in rec:
            for label, v, _ in FIGURES[bench](rec["result"]):
                if v is not None:
                    values.setdefault(label, []).append(v)
    return values


def _directions(runs: list[dict[str, Any]], bench: str) -> dict[str, str]:
    """Each figure of ``bench`` met in any run, in the benchmark's order, with its better way."""
    seen: dict[str, str] = {}
    for rec in runs:
        if rec["bench"] == bench and "result" in rec:
            for label, _, better in FIGURES[bench](rec["result"]):
                seen.setdefault(label, better)
    return seen


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "–"
    if digits == 2:
        return f"{v:.2f}"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"


def verdict(better: str, ratio: float | None, noise: float) -> str:
    """"slower" when a figure moved the bad way by more than ``noise`` (a fraction)."""
    if ratio is None or better == INFO:
        return ""
    worse = ratio < 1 / (1 + noise) if better == HIGHER else ratio > 1 + noise
    improved = ratio > 1 + noise if better == HIGHER else ratio < 1 / (1 + noise)
    return "**slower**" if worse else ("faster" if improved else "")


def rows(data: dict[str, Any], bench: str) -> list[dict[str, Any]]:
    """One row per figure: the median over passes of each side, after ÷ before, the verdict."""
    runs = data["runs"]
    out = []
    before, after = _figures_of(runs, bench, "before"), _figures_of(runs, bench, "after")
    for label, better in _directions(runs, bench).items():
        b, a = before.get(label, []), after.get(label, [])
        mb = statistics.median(b) if b else None
        ma = statistics.median(a) if a else None
        ratio = _div(ma, mb)
        out.append({
            "figure": label, "better": better, "before": b, "after": a,
            "ratio": ratio, "verdict": verdict(better, ratio, data["noise"]),
        })
    return out


def render(data: dict[str, Any], level: int = 3, title: str | None = None) -> str:
    """The markdown of one side-by-side run; its subsections at heading ``level``."""
    h = "#" * level
    tb, ta = data["trees"]["before"], data["trees"]["after"]
    loads = [x for r in data["runs"] for x in (r["load_start"], r["load_end"])]

    def tree(t: dict[str, Any]) -> str:
        lib = t.get("library", t["commit"])
        where = f"`{t['commit']}`" if lib == t["commit"] else f"`{t['commit']}`, library as of `{lib}`"
        return f"{where} ({t['subject']}{', with uncommitted changes' if t['dirty'] else ''})"

    lines = [
        f"{h} {title or 'Run of ' + data['date']}",
        "",
        f"Before: {tree(tb)}; after: {tree(ta)}. "
        f"{data['date']}, {data['machine']}. Command: `{data['command']}` "
        f"({data['passes']} pass{'es' if data['passes'] > 1 else ''}, {data.get('wall_s', 0) / 60:.1f} min). "
        f"Load average (1 min) {data['load_before']:.1f} at the start, {min(loads):.1f}–{max(loads):.1f} "
        "during the runs: the machine was busy with other engineers' work (tests, benchmarks) "
        "throughout."
        + (" Every engine of both trees made with `seal=False` (`--unsealed`): sealed segments "
           "left out." if data.get("unsealed") else ""),
        "",
        f"Every figure is a ratio against the raw baseline measured in the same run; before and after are "
        "medians over the passes (each pass's values in brackets when there are several); "
        f"after ÷ before > 1 means the ratio grew. **slower**: moved the bad way by more than "
        f"{data['noise']:.0%}; faster: the good way by as much. Feed latencies are absolute "
        "milliseconds with no baseline in the run: shown, not judged.",
    ]
    for bench in data["benches"]:
        recs = [r for r in data["runs"] if r["bench"] == bench]
        if not recs:
            lines += ["", f"{h}# {bench}", "", "Not run yet in this run (it was cut short)."]
            continue
        took = ", ".join(
            f"{r['side']} {r['seconds']:.0f} s" + ("" if "result" in r else f" FAILED ({r['error']})")
            for r in recs
        )
        opts = " ".join(o if o else "''" for o in OPTIONS[bench]).replace("{json}", "…")
        lines += [
            "",
            f"{h}# {bench}",
            "",
            f"`python -m benchmarks {bench} {opts}` in each tree ({took}).",
            "",
            "| figure | better | before | after | after ÷ before | |",
            "|---|---|--:|--:|--:|---|",
        ]
        for row in rows(data, bench):
            def cell(vals: list[float]) -> str:
                if not vals:
                    return "–"
                med = _fmt(statistics.median(vals))
                return med if len(vals) == 1 else f"{med} ({', '.join(_fmt(v) for v in vals)})"

            lines.append(
                f"| {row['figure']} | {row['better']} | {cell(row['before'])} | {cell(row['after'])} | "
                f"{_fmt(row['ratio'], 2)} | {row['verdict']} |"
            )
    return "\n".join(lines) + "\n"


# -- the run --------------------------------------------------------------------------------


def run(
    args: argparse.Namespace, argv: Sequence[str], progress: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Every pass: per benchmark, both trees, who goes first alternating; the runs' records.
    ``progress`` is called with the data so far after each benchmark's pair of runs."""
    trees = {"before": resolve_tree(args.before, args.trees), "after": resolve_tree(args.after, args.trees)}
    stamp = dt.datetime.now(dt.timezone.utc)
    out = args.out / stamp.strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "date": stamp.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.system()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "command": "python -m benchmarks sidebyside " + " ".join(argv),
        "trees": {side: describe(tree) for side, tree in trees.items()},
        "benches": args.only,
        "passes": args.passes,
        "noise": args.noise,
        "unsealed": args.unsealed,
        "load_before": os.getloadavg()[0],
        "runs": [],
        "dir": str(out),
    }
    t0 = time.perf_counter()
    turn = 0
    for n in range(1, args.passes + 1):
        for bench in args.only:
            order = ("before", "after") if turn % 2 == 0 else ("after", "before")
            turn += 1
            for side in order:
                rec = run_one(trees[side], bench, side, n, out, args.timeout, args.unsealed)
                print(f"[sidebyside] pass {n} {bench} {side}: {rec['seconds']:.0f} s, load "
                      f"{rec['load_start']:.1f}→{rec['load_end']:.1f}"
                      + (f", {rec['error']}" if "error" in rec else ""), flush=True)
                data["runs"].append(rec)
            data["wall_s"] = time.perf_counter() - t0
            (out / "sidebyside.json").write_text(json.dumps(data, indent=1))
            progress(data)
    data["wall_s"] = time.perf_counter() - t0
    (out / "sidebyside.json").write_text(json.dumps(data, indent=1))
    print(f"[sidebyside] {out / 'sidebyside.json'}", flush=True)
    return data


def repeats(runs: Sequence[dict[str, Any]]) -> str:
    """A table of every figure marked slower in any run, with its after ÷ before in each: a
    figure slower in one run only is the machine's noise; slower in every run, a finding."""
    heads = [
        f"{d['date'][11:16]}{' unsealed' if d.get('unsealed') else ''} (`{d['trees']['after'].get('library', '?')}`)"
        for d in runs
    ]
    per_run = [{(b, r["figure"]): r for b in d["benches"] for r in rows(d, b)} for d in runs]
    flagged = [k for k in dict.fromkeys(k for table in per_run for k in table)
               if any(t.get(k, {}).get("verdict") == "**slower**" for t in per_run)]
    lines = [
        "Every figure marked slower in any of the runs below, with its after ÷ before in each "
        "(newest first; – where a run did not measure it; * marks slower):",
        "",
        "| benchmark | figure | better | " + " | ".join(heads) + " |",
        "|---|---|---|" + "--:|" * len(heads),
    ]
    for bench, figure in flagged:
        cells = []
        for table in per_run:
            r = table.get((bench, figure))
            cells.append("–" if r is None or r["ratio"] is None else
                         f"{r['ratio']:.2f}{'*' if r['verdict'] == '**slower**' else ''}")
        better = next(t[(bench, figure)]["better"] for t in per_run if (bench, figure) in t)
        lines.append(f"| {bench} | {figure} | {better} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(runs: Sequence[dict[str, Any]], notes: str = "") -> str:
    """The RESULTS.md section: ``notes`` (what the runs showed), the newest run, then any
    earlier ones below it, labelled."""
    text = [
        SECTION,
        "",
        "The store, streaming, feed and compare benchmarks of the project before its layout "
        "redesign and after it, run side by side by `python -m benchmarks sidebyside` "
        "(`benchmarks/sidebyside.py`: each tree's own benchmark code and virtualenv, each run under "
        "its tree's own `scripts/with-postgres`, before and after alternating).",
        "",
    ]
    if notes:
        text += [notes.strip(), ""]
    if len(runs) > 1:
        text += [repeats(runs), ""]
    for i, data in enumerate(runs):
        after = data["trees"]["after"]
        label = "Latest run" if i == 0 else "Earlier run"
        if data.get("unsealed"):
            label += ", unsealed (`--unsealed`)"
        text.append(render(data, 3, f"{label}: {data['date']}, after = `{after.get('library', after['commit'])}`"))
    return "\n".join(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both trees' benchmarks side by side (or render saved runs) and record the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks sidebyside", description=__doc__.splitlines()[0])
    p.add_argument("--before", default="3bcf4b1", help="revision or checkout directory (default 3bcf4b1)")
    p.add_argument("--after", default="HEAD", help="revision or checkout directory (default HEAD)")
    p.add_argument("--only", default=",".join(BENCHES), help="benchmarks to run, comma-separated")
    p.add_argument("--passes", type=int, default=1, help="passes over the benchmarks (figures: median)")
    p.add_argument("--noise", type=float, default=0.25,
                   help="a ratio that moved the bad way by more than this fraction is marked slower")
    p.add_argument("--unsealed", action="store_true",
                   help="make every engine with seal=False where the tree has sealed segments")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before one run is given up")
    p.add_argument("--trees", type=Path, default=HERE / "out" / "trees",
                   help="where worktrees of revisions are made")
    p.add_argument("--out", type=Path, default=OUT, help="where each run's logs and JSON go")
    p.add_argument("--results", type=Path, default=HERE / "RESULTS.md")
    p.add_argument("--no-record", action="store_true", help="do not rewrite RESULTS.md")
    p.add_argument("--notes", type=Path, default=None,
                   help="markdown put above the tables (what the runs showed)")
    p.add_argument("--from-json", nargs="+", type=Path, default=None,
                   help="render saved runs (sidebyside.json), newest first, instead of running")
    p.add_argument("--earlier", nargs="+", type=Path, default=[],
                   help="saved runs to show below this run's tables, labelled earlier")
    args = p.parse_args(argv)
    args.only = [b for b in args.only.split(",") if b]
    unknown = set(args.only) - set(BENCHES)
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(sorted(unknown))}; choose from {', '.join(BENCHES)}")
    earlier = [json.loads(f.read_text()) for f in [*(args.from_json or []), *args.earlier]]
    notes = args.notes.read_text() if args.notes else ""

    def record(data: dict[str, Any] | None) -> None:
        # Recorded after every benchmark, so a run cut short still leaves its finished tables.
        if not args.no_record:
            record_section(args.results, SECTION, section(([data] if data else []) + earlier, notes))

    if args.from_json:
        runs = earlier
        record(None)
    else:
        runs = [run(args, argv, record)] + earlier
    print(section(runs, notes))
    failed = [r for d in runs[:1] for r in d["runs"] if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
