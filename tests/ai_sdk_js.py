"""Runs the ai npm package (tests/js, both supported majors) as the judge of UI message streams."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

JS = Path(__file__).resolve().parent / "js"

#: The client majors under test: (protocol the server speaks, the npm alias installed for it).
MAJORS = [(5, "ai5"), (7, "ai7")]


def require_node() -> str:
    """The node binary, with tests/js installed; a failure (not a skip) when missing."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: the AI SDK tests run the ai npm package")
    if not (JS / "node_modules" / "ai5").is_dir() or not (JS / "node_modules" / "ai7").is_dir():
        pytest.fail("tests/js is not installed: run `npm ci --prefix tests/js` (make test does)")
    return node


def run_node(script: str, *args: str, payload: Any = None, timeout: float = 120) -> Any:
    """Run ``tests/js/<script>`` with ``payload`` as JSON on stdin; its JSON stdout."""
    node = require_node()
    proc = subprocess.run(
        [node, str(JS / script), *args], input=json.dumps(payload).encode(),
        capture_output=True, timeout=timeout, check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"node {script} {' '.join(args)} failed:\n{proc.stderr.decode()[-4000:]}")
    return json.loads(proc.stdout)
