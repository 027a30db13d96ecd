"""Running the `eventstore` program in a process of its own, for the CLI tests.

A run is a child forked from a warm copy of the program (tests/cli_server.py says what
that keeps of a real run), or the real console script in a subprocess for ``real=True``
and whenever ``EVENTSTORE_TEST_CLI=real`` is set.
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

EXE = Path(sys.executable).parent / "eventstore"
#: How long one run may take before it is killed (the subprocess timeout it always had).
RUN_TIMEOUT = 120.0


class _Server:
    """This process's tests/cli_server.py, started at the first run, one run at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        self.dir = Path(tempfile.mkdtemp(prefix="eventstore-cli-"))
        requests_r, self.requests = os.pipe()
        self.replies, replies_w = os.pipe()
        env = {k: v for k, v in os.environ.items() if k != "EVENTSTORE_URL"}
        server = Path(__file__).with_name("cli_server.py")
        proc = subprocess.Popen(
            [sys.executable, str(server), str(EXE), str(requests_r), str(replies_w)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
            pass_fds=(requests_r, replies_w),
        )
        os.close(requests_r)
        os.close(replies_w)
        self.pending = b""
        atexit.register(self.stop)
        return proc

    def stop(self) -> None:
        if self.proc is not None:
            os.close(self.requests)
            os.close(self.replies)
            self.proc.wait(timeout=30)
            self.proc = None
            shutil.rmtree(self.dir, ignore_errors=True)

    def _reply(self, deadline: float | None) -> dict[str, Any]:
        while b"\n" not in self.pending:
            ready, _, _ = select.select([self.replies], [], [], deadline)
            if not ready:
                raise TimeoutError
            chunk = os.read(self.replies, 65536)
            if not chunk:
                raise RuntimeError("tests/cli_server.py ended (its stderr is above)")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return dict(json.loads(line))

    def run(self, argv: list[str], input: str | None, cwd: Path | None, env: dict[str, str]) -> tuple[int, str, str]:
        """Run ``argv`` in a forked child: (exit status, stdout, stderr) as ``subprocess`` reports them."""
        with self.lock:
            if self.proc is None:
                self.proc = self._start()
            encoding = locale.getpreferredencoding(False)
            stdin = self.dir / "stdin"
            stdin.write_bytes(b"" if input is None else input.encode(encoding))
            paths = {"stdin": str(stdin), "stdout": str(self.dir / "stdout"), "stderr": str(self.dir / "stderr")}
            request = {"argv": argv, "env": env, "cwd": str(cwd or os.getcwd()), **paths}
            os.write(self.requests, (json.dumps(request) + "\n").encode())
            pid = int(self._reply(None)["pid"])
            try:
                status = int(self._reply(RUN_TIMEOUT)["status"])
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._reply(None)
                raise subprocess.TimeoutExpired(argv, RUN_TIMEOUT) from None

            def text(path: str) -> str:
                # As subprocess's text mode reads a pipe: the locale's encoding, universal newlines.
                return Path(path).read_bytes().decode(encoding).replace("\r\n", "\n").replace("\r", "\n")

            return status, text(paths["stdout"]), text(paths["stderr"])


_SERVER = _Server()


def run_cli(
    *args: str,
    db: str | None = None,
    input: str | None = None,
    code: int | None = 0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    real: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``eventstore [--db DB] ARGS``; check the exit code and that no traceback shows.

    ``real``: start the console script itself (as every run does under
    ``EVENTSTORE_TEST_CLI=real``) rather than fork the warm program."""
    full_env = {k: v for k, v in os.environ.items() if k != "EVENTSTORE_URL"}
    full_env.update({"COLUMNS": "80", "NO_COLOR": "1"})
    full_env.update(env or {})
    argv = [str(EXE), *(["--db", db] if db is not None else []), *args]
    if real or os.environ.get("EVENTSTORE_TEST_CLI") == "real":
        r = subprocess.run(
            argv, input=input, capture_output=True, text=True, cwd=cwd, env=full_env, timeout=RUN_TIMEOUT
        )
    else:
        r = subprocess.CompletedProcess(argv, *_SERVER.run(argv, input, cwd, full_env))
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
