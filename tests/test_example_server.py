"""The example chat server (examples/chat_server.py), run by uvicorn and driven over HTTP."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from ai_sdk_js import MAJORS, run_node

from eventstore import EventStore
from eventstore.core.reducer import fold_json
from eventstore.integrations.ai_sdk import to_ui_messages

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A running example server: its base URL, and its output once it has stopped."""

    def __init__(self, base: str, proc: subprocess.Popen[bytes]) -> None:
        self.base = base
        self.proc = proc
        self.output = ""


@contextlib.contextmanager
def serve(db_url: str, **env: str) -> Iterator[Served]:
    """The example server on a free loopback port, on the test's database."""
    port = _free_port()
    full_env = {**os.environ, "EVENTSTORE_URL": db_url, "CHAT_WORD_DELAY": "0.02", **env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "examples.chat_server:app",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    served = Served(f"http://127.0.0.1:{port}", proc)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{served.base}/sessions/none", timeout=1).status_code == 404:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.stdout else ""
                pytest.fail(f"the example server did not start:\n{out}")
            time.sleep(0.05)
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        served.output = proc.stdout.read().decode() if proc.stdout else ""


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    """The example server's base URL."""
    with serve(db_url) as served:
        yield served.base


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
        assert client.post("/sessions/s1/messages", content=b"not json").status_code == 415
        bad = client.post("/sessions/s1/messages", content=b"not json", headers={"content-type": "application/json"})
        assert bad.status_code == 400
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


# --------------------------------------------------------------------------- useChat


def _can_rewind() -> bool:
    from eventstore import AsyncEventStore

    return hasattr(AsyncEventStore, "rewind")


LONG = " ".join(f"word{i}" for i in range(40))
STORY = " ".join(f"word{i}" for i in range(150))  # ~3 s of reply: long enough to stop or reload midway


@pytest.mark.parametrize(("protocol", "major"), MAJORS)
def test_use_chat_against_the_server_holds_what_the_log_holds(db_url: str, protocol: int, major: str) -> None:
    steps: list[dict[str, Any]] = [
        {"do": "send", "text": "hello there"},
        {"do": "send", "text": "what is the weather like?"},
        {"do": "send", "text": "please fail now"},
        {"do": "regenerate"},
        {"do": "stop", "text": f"a long story: {STORY}"},
        {"do": "reload", "text": f"another long story: {STORY}"},
    ]
    if _can_rewind():
        steps.append({"do": "edit", "index": 1, "text": "what is the weather like at sea?"})
    with serve(db_url, CHAT_AI_SDK_PROTOCOL=str(protocol)) as served:
        results = run_node("chat_client.mjs", major, served.base, "chat-1", payload=steps)
        stored = httpx.get(f"{served.base}/api/chat/chat-1/messages").json()
    assert "Traceback" not in served.output, served.output
    assert [r["step"] for r in results] == [s["do"] for s in steps]
    with EventStore(db_url) as store:
        assert stored == {"messages": to_ui_messages(store.load("chat-1"), protocol), "status": "idle"}
        assert results[-1]["messages"] == stored["messages"]
        if not _can_rewind():
            # Without a rewind the log only grew: every step's state is still at its version.
            for r in results:
                assert r["messages"] == to_ui_messages(store.load("chat-1", version=r["version"]), protocol), r["step"]
        state = store.load("chat-1").to_json()
        # The stop is recorded once; after an edit it lives on the line the rewind kept.
        lines = ["chat-1", *(info.id for info in store.lines("chat-1"))]
        stops = {(e.session_id, e.version) for line in lines for e in store.history(line) if e.type == "stop"}
        assert len(stops) == 1

    hello, weather, failed, regenerated, stopped, reloaded = results[:6]
    assert hello["status"] == "ready" and hello["messages"][-1]["parts"][-1]["text"] == "You said: hello there"
    tools = [p for p in weather["messages"][-1]["parts"] if p["type"] == "tool-get_weather"]
    assert [t["state"] for t in tools] == ["output-available"]
    assert failed["status"] == "error" and "lost its connection" in failed["error"]
    assert regenerated["status"] == "ready" and regenerated["messages"][-1]["parts"][-1]["text"].endswith("fail now")
    assert len([m for m in regenerated["messages"] if m["role"] == "user"]) == 3
    assert stopped["stop"] == 204
    stopped_text = stopped["messages"][-1]["parts"][-1]["text"]
    assert stopped_text.startswith("You said:") and not stopped_text.endswith("word149")
    assert reloaded["cut"] and reloaded["cut"] != reloaded["resumed"]
    assert reloaded["resumed"] == f"You said: another long story: {STORY}"
    if _can_rewind():
        edited = results[6]
        users = [m for m in edited["messages"] if m["role"] == "user"]
        assert [u["parts"][0]["text"] for u in users] == ["hello there", "what is the weather like at sea?"]
        assert [m["id"] for m in state["messages"] if m["role"] == "user"] == [u["id"] for u in users]
        assert users[1]["id"] == [m for m in weather["messages"] if m["role"] == "user"][1]["id"]


def test_the_chat_routes_refuse_what_they_cannot_take(db_url: str) -> None:
    with serve(db_url, CHAT_MAX_BODY="2000", CHAT_BODY_TIMEOUT="1") as served, \
            httpx.Client(base_url=served.base, timeout=10) as client:
        ok_body = {"id": "s", "messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}
        assert client.post("/api/chat", content=orjson.dumps(ok_body)).status_code == 415
        assert client.post("/api/chat", content=b"{", headers={"content-type": "application/json"}).status_code == 400
        assert client.post("/api/chat", json={"id": "s"}).status_code == 400
        assert client.post("/api/chat", json={**ok_body, "trigger": "explode"}).status_code == 400
        assert client.post("/api/chat", json={"id": "s", "messages": [], "trigger": "regenerate-message"}).status_code == 400
        assert client.post("/api/chat", json={**ok_body, "id": "x" * 201}).status_code == 400
        # Declared too large: refused before a byte of the body is read.
        assert client.post("/api/chat", json={**ok_body, "pad": "x" * 5000}).status_code == 413

        def chunked() -> Iterator[bytes]:  # no content-length: counted as it arrives
            yield b'{"pad": "'
            for _ in range(100):
                yield b"x" * 100
            yield b'"}'

        r = client.post("/api/chat", content=chunked(), headers={"content-type": "application/json"})
        assert r.status_code == 413

        def slow() -> Iterator[bytes]:
            yield b'{"id": '
            time.sleep(2)
            yield b'"s"}'

        r = client.post("/api/chat", content=slow(), headers={"content-type": "application/json"})
        assert r.status_code == 408
        assert client.get("/api/chat/none/stream").status_code == 204
        assert client.get("/api/chat/none/messages").json() == {"messages": [], "status": "idle"}
        assert client.post("/api/chat/none/stop").status_code == 404
        page = client.get("/")
        assert page.status_code == 200 and "<script>" in page.text and "http" not in page.text.split("<script>")[1]
    assert "Traceback" not in served.output, served.output


def test_a_client_that_disconnects_does_not_end_the_reply(db_url: str) -> None:
    body = {"id": "s1", "trigger": "submit-message",
            "messages": [{"id": "u-1", "role": "user", "parts": [{"type": "text", "text": LONG}]}]}
    with serve(db_url) as served, httpx.Client(base_url=served.base, timeout=10) as client:
        with client.stream("POST", "/api/chat", json=body) as r:
            assert r.status_code == 200 and r.headers["x-vercel-ai-ui-message-stream"] == "v1"
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
        # Gone mid-reply: the reply is finished anyway, and the stored reply is whole.
        deadline = time.monotonic() + 30
        while client.get("/sessions/s1").json()["status"] == "streaming":
            assert time.monotonic() < deadline, "the reply stopped with its client"
            time.sleep(0.05)
        assert client.get("/api/chat/s1/stream").status_code == 204
        messages = client.get("/api/chat/s1/messages").json()["messages"]
        assert messages[-1]["parts"][-1] == {"type": "text", "text": f"You said: {LONG}", "state": "done"}
    assert "Traceback" not in served.output, served.output
