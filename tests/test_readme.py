"""The README's CLI tour runs as written: a quickstart that fails is worse than none.

(Its Python examples, and those of docs/, are run by tests/test_docs.py.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def cli_tour() -> str:
    """The README's CLI tour: the text between the CLI-TOUR markers."""
    start, end = "<!-- CLI-TOUR -->", "<!-- /CLI-TOUR -->"
    assert start in README and end in README, "the README marks its CLI tour"
    return README.split(start, 1)[1].split(end, 1)[0]


def _tour_commands() -> list[tuple[str, bool]]:
    """The `eventstore ...` lines of the CLI tour, in order, each with whether its comment
    says it is meant to fail (`# fails: ...`)."""
    tour = cli_tour()
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", tour, flags=re.S):
        for line in block.splitlines():
            cmd, _, comment = line.partition("  #")
            if cmd.strip().startswith(("eventstore ", "echo ")):
                cmds.append((cmd.strip(), comment.strip().startswith("fails")))
    return cmds


def test_cli_tour_runs_in_order(tmp_path: Path) -> None:
    cmds = _tour_commands()
    assert cmds, "the README has a CLI tour"
    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "EVENTSTORE_URL": f"sqlite:///{tmp_path / 'tour.db'}",
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
    }
    for cmd, expect_fail in cmds:
        proc = subprocess.run(
            cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert (proc.returncode != 0) == expect_fail, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, f"{cmd}\n{proc.stderr}"
