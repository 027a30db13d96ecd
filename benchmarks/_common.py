"""What the benchmark modules share: the machine header of a report, and timed runs."""

from __future__ import annotations

import gc
import os
import platform
import re
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

__all__ = ["machine", "record_section", "run_times", "timed", "extract_tree", "count_events"]


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "-"


def machine(packages: Sequence[str], *, implementation: bool = False) -> dict[str, Any]:
    """Where the figures come from: OS, CPUs, Python and the versions of ``packages``.

    Args:
        packages: distributions whose installed versions go in the header ("-" if absent).
        implementation: append the Python implementation to its version ("3.12.1 (CPython)").
    """
    python = sys.version.split()[0]
    if implementation:
        python += f" ({platform.python_implementation()})"
    return {
        "uname": " ".join(platform.uname()),
        "nproc": os.cpu_count(),
        "python": python,
        "packages": {p: _version(p) for p in packages},
    }


def run_times(
    fn: Callable[[], Any],
    repeats: int,
    warmup: int,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> list[float]:
    """Seconds taken by each of ``repeats`` runs of ``fn``, after ``warmup`` unmeasured runs.

    The garbage collector stays on, as in production; the heap is collected before each
    run. ``clock`` counts nanoseconds (wall time by default; ``time.process_time_ns`` for
    the CPU time of this process).
    """
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        gc.collect()
        t0 = clock()
        fn()
        samples.append((clock() - t0) / 1e9)
    return samples


def timed(
    fn: Callable[[], Any],
    repeats: int,
    warmup: int = 2,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, float]:
    """Median and best of :func:`run_times`, in seconds."""
    samples = run_times(fn, repeats, warmup, clock)
    return {"median": statistics.median(samples), "best": min(samples)}


def split_turns(actions: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split a chat into turns: each starts at a ``send``."""
    turns: list[list[dict[str, Any]]] = []
    for a in actions:
        if a["type"] == "send" or not turns:
            turns.append([])
        turns[-1].append(a)
    return turns


def record_section(results_md: Path, heading: str, section: str) -> None:
    """Replace (or append) the section starting with ``heading`` in RESULTS.md.

    Other sections are left as they are; ``section`` must start with ``heading``.
    """
    text = results_md.read_text() if results_md.exists() else "# Benchmark results\n\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section.rstrip("\n") + "\n\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    results_md.write_text(text)


def extract_tree(root: Path, revision: str, into: Path) -> Path:
    """The source tree of ``revision`` (eventstore, cli, migrations) of the repository at
    ``root``, extracted under ``into``: a baseline to run side by side with the working tree."""
    archive = into / "tree.tar"
    with archive.open("wb") as fh:
        subprocess.run(
            ["git", "-C", str(root), "archive", revision, "eventstore", "cli", "migrations"],
            stdout=fh,
            check=True,
        )
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def count_events(url: str) -> int:
    """Events written: the rows, plus the events of the segments that closed turns were
    sealed into (sealing deletes their rows; the bare table of ``raw`` has no segments)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM events").fetchone()
        rows = int(row[0]) if row else 0
        if conn.execute("SELECT to_regclass('event_segments')").fetchone() == (None,):
            return rows
        row = conn.execute(
            "SELECT coalesce(sum(last_version - first_version + 1), 0) FROM event_segments"
        ).fetchone()
    return rows + (int(row[0]) if row else 0)
