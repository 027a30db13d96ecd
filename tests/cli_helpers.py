"""Running the real `eventstore` program in a subprocess, for the CLI tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

EXE = Path(sys.executable).parent / "eventstore"


def run_cli(
    *args: str,
    db: str | None = None,
    input: str | None = None,
    code: int | None = 0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``eventstore [--db DB] ARGS``; check the exit code and that no traceback shows."""
    full_env = {k: v for k, v in os.environ.items() if k != "EVENTSTORE_URL"}
    full_env.update({"COLUMNS": "80", "NO_COLOR": "1"})
    full_env.update(env or {})
    argv = [str(EXE), *(["--db", db] if db is not None else []), *args]
    r = subprocess.run(argv, input=input, capture_output=True, text=True, cwd=cwd, env=full_env, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    if code is not None:
        assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    return r


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The single ``error: …`` line of a failed run (asserting there is exactly one)."""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def json_error(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The ``{"error": {...}}`` object of a failed ``--json`` run."""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    doc = json.loads(lines[0])
    assert set(doc) == {"error"} and set(doc["error"]) == {"type", "message"}, doc
    return dict(doc["error"])
