"""The example chat server (examples/chat_server.py), run by uvicorn and driven over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from eventstore.reducer import fold_json

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    """The example server on a free loopback port, on the test's database; its base URL."""
    port = _free_port()
    env = {**os.environ, "EVENTSTORE_URL": db_url, "CHAT_WORD_DELAY": "0.02"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "examples.chat_server:app",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/sessions/none", timeout=1).status_code == 404:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.stdout else ""
                pytest.fail(f"the example server did not start:\n{out}")
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_example_server_persists_streams_and_serves_history(server: str) -> None:
    with httpx.Client(base_url=server, timeout=10) as client:
        parts = []
        with client.stream("POST", "/sessions/s1/messages", json={"id": "u-1", "text": "two mugs"}) as r:
            assert r.status_code == 200
            assert r.headers["x-session-version"] == "1"
            lines = r.iter_lines()
            parts.append(orjson.loads(next(lines)))
            # The user's message is stored before the reply has finished streaming.
            during = client.get("/sessions/s1/history").json()
            assert during[0]["action"] == {"type": "send", "id": "u-1", "text": "two mugs"}
            assert client.get("/sessions/s1").json()["status"] == "streaming"
            parts += [orjson.loads(line) for line in lines if line]
        assert parts[0]["type"] == "message-start" and parts[-1] == {"type": "finish", "reason": "stop"}
        streamed = "".join(p["text"] for p in parts if p["type"] == "text-delta")
        assert streamed == "You said: two mugs"

        history = client.get("/sessions/s1/history").json()
        assert [e["version"] for e in history] == list(range(1, len(parts) + 2))
        assert [e["action"]["part"] for e in history[1:]] == parts  # every streamed part, in order
        assert [e["actor"] for e in history] == ["user"] + ["model:echo"] * len(parts)

        state = client.get("/sessions/s1").json()
        assert state == fold_json(None, [e["action"] for e in history])
        assert state["status"] == "idle"
        assert [m["role"] for m in state["messages"]] == ["user", "assistant"]
        assert client.get("/sessions/s1", params={"version": 1}).json()["status"] == "streaming"

        assert client.get("/sessions/missing").status_code == 404
        assert client.get("/sessions/missing/history").status_code == 404
        assert client.post("/sessions/s1/messages", content=b"not json").status_code == 400
        assert client.get("/sessions/s1", params={"version": "x"}).status_code == 400
        assert client.get("/sessions/s1", params={"version": 999}).status_code == 400
