"""The example chat server (examples/chat_server.py), run by uvicorn and driven over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from eventstore.core.reducer import fold_json

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


def _sse(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """Server-Sent Events from a stream of lines: one dict of fields per event."""
    event: dict[str, str] = {}
    for line in lines:
        if not line:
            if event:
                yield event
            event = {}
            continue
        name, _, value = line.partition(":")
        event[name] = value[1:] if value.startswith(" ") else value


def test_events_stream_as_sse_and_resume_from_last_event_id_in_the_middle_of_a_turn(server: str) -> None:
    text = " ".join(f"w{i}" for i in range(60))  # a reply of 60 words, one part each (~1.2 s)
    replied: list[bytes] = []

    def chat() -> None:
        with httpx.Client(base_url=server, timeout=30) as c:
            replied.append(c.post("/sessions/s1/messages", json={"id": "u-1", "text": text}).content)

    with httpx.Client(base_url=server, timeout=30) as client:
        writer = threading.Thread(target=chat)
        writer.start()
        # The session exists once the user's message is durable.
        deadline = time.monotonic() + 30
        while client.get("/sessions/s1").status_code == 404:
            assert time.monotonic() < deadline, "the user's message was never stored"
            time.sleep(0.01)
        seen: list[dict[str, str]] = []
        with client.stream("GET", "/sessions/s1/events") as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            for ev in _sse(r.iter_lines()):
                seen.append(ev)
                if len(seen) == 4:  # the send, message-start and two deltas: mid-turn
                    break
        assert seen[-1]["event"] == "part"
        assert client.get("/sessions/s1").json()["status"] == "streaming"  # the turn goes on
        # Reconnect as a browser's EventSource does: with the last id it got.
        with client.stream("GET", "/sessions/s1/events", headers={"Last-Event-ID": seen[-1]["id"]}) as r:
            for ev in _sse(r.iter_lines()):
                seen.append(ev)
                if orjson.loads(ev["data"])["action"].get("part", {}).get("type") == "finish":
                    break
        writer.join(30)
        history = client.get("/sessions/s1/history").json()
        assert [int(ev["id"]) for ev in seen] == [e["version"] for e in history]  # none lost, none twice
        assert [orjson.loads(ev["data"]) for ev in seen] == history
        assert [ev["event"] for ev in seen] == [e["type"] for e in history]
        assert replied and replied[0].endswith(b'{"type":"finish","reason":"stop"}\n')

        resumed = client.get("/sessions/s1/events", params={"after": "x"})
        assert resumed.status_code == 400
        assert client.get("/sessions/missing/events").status_code == 404
