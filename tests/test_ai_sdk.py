"""The AI SDK adapter, judged by the ai npm package itself (ai@5 and the newest major).

Every chunk the encoder emits for a set of recorded sessions goes through the package's
own parse path (``parseJsonEventStream`` with ``uiMessageChunkSchema``), and
``readUIMessageStream`` (the client's fold) rebuilds each turn's reply: it must equal the
reply :func:`to_ui_messages` gives for the stored state, so a reloaded page shows what the
live page showed.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from ai_sdk_js import MAJORS, run_node

from eventstore.core.reducer import fold_json
from eventstore.errors import InvalidEvent
from eventstore.integrations.ai_sdk import (
    UI_MESSAGE_STREAM_HEADERS,
    UIMessageStreamEncoder,
    session_ui_messages,
    sse,
    to_ui_messages,
    turns_of,
)
from eventstore.samples import chat_session, demo_conversation


def _p(part: dict[str, Any], within: str | None = None) -> dict[str, Any]:
    action: dict[str, Any] = {"type": "part", "part": part}
    if within is not None:
        action["within"] = within
    return action


def _say(mid: str, *words: str, within: str | None = None) -> list[dict[str, Any]]:
    return [_p({"type": "text-delta", "messageId": mid, "text": w}, within) for w in words]


def _sessions() -> dict[str, list[dict[str, Any]]]:
    s: dict[str, list[dict[str, Any]]] = {"demo": demo_conversation(), "chat": chat_session(3, seed=7, deltas=6)}
    s["tools"] = [
        {"type": "send", "id": "u-1", "text": "weather?"},
        _p({"type": "message-start", "messageId": "a-1"}),
        _p({"type": "reasoning", "messageId": "a-1", "text": "Look it up."}),
        _p({"type": "reasoning", "messageId": "a-1", "text": "Twice."}),
        _p({"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "weather", "input": {"city": "Oslo"}}),
        _p({"type": "tool-call", "messageId": "a-1", "id": "c-2", "name": "weather", "input": {"city": "Rome"}}),
        _p({"type": "tool-result", "id": "c-2", "output": {"t": 21}}),
        _p({"type": "tool-error", "id": "c-1", "error": {"message": "no station"}}),
        _p({"type": "step-finish"}),
        _p({"type": "message-start", "messageId": "a-2"}),
        *_say("a-2", "Rome ", "is ", "warm."),
        _p({"type": "tool-call", "messageId": "a-2", "id": "c-3", "name": "log", "input": None}),
        _p({"type": "tool-error", "id": "c-3", "error": ["raw", 1]}),
        _p({"type": "tool-call", "messageId": "a-2", "id": "c-4", "name": "log", "input": {}}),
        _p({"type": "tool-error", "id": "c-4", "error": {"code": "cancelled", "message": "user left"}}),
        _p({"type": "finish", "reason": "tool-calls-and-more"}),
        {"type": "send", "id": "u-2", "text": "and now?"},
        _p({"type": "message-start", "messageId": "a-3"}),
        *_say("a-3", "Still ", "warm."),
        _p({"type": "finish"}),
    ]
    s["stop"] = [
        {"type": "send", "id": "u-1", "text": "long story"},
        _p({"type": "message-start", "messageId": "a-1"}),
        *_say("a-1", "Once ", "upon"),
        _p({"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "search", "input": {"q": "x"}}),
        {"type": "stop"},
        {"type": "send", "id": "u-2", "text": "again"},
        _p({"type": "message-start", "messageId": "a-2"}),
        *_say("a-2", "Half"),
        _p({"type": "finish", "reason": "aborted"}),
        {"type": "send", "id": "u-3", "text": "nothing at all"},
        {"type": "stop"},
    ]
    s["errors"] = [
        {"type": "send", "id": "u-1", "text": "hi"},
        _p({"type": "error", "error": "Too many requests.", "code": "rate_limited"}),
        {"type": "retry"},
        _p({"type": "message-start", "messageId": "a-1"}),
        _p({"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "lookup", "input": {"k": 1}}),
        _p({"type": "tool-result", "id": "c-1", "output": "found"}),
        *_say("a-1", "Partial <b>&amp;</b> ", "\u202eanswer"),
        _p({"type": "error", "error": "Lost the connection."}),
        {"type": "retry"},
        _p({"type": "message-start", "messageId": "a-2"}),
        *_say("a-2", "Full answer."),
        _p({"type": "finish", "reason": "stop"}),
    ]
    s["confirm"] = [
        {"type": "send", "id": "u-1", "text": "buy it"},
        _p({"type": "message-start", "messageId": "a-1"}),
        _p({"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "buy", "input": {"sku": 1}}),
        {"type": "toolPhase", "name": "buy", "state": "awaiting-confirmation", "prompt": "Pay $5?"},
        {"type": "stop"},
        {"type": "send", "id": "u-2", "text": "ask me"},
        _p({"type": "message-start", "messageId": "a-2"}),
        _p({"type": "tool-call", "messageId": "a-2", "id": "c-2", "name": "buy", "input": {"sku": 2}}),
        {"type": "toolPhase", "name": "buy", "state": "awaiting-confirmation"},
    ]
    s["nested"] = [
        {"type": "send", "id": "u-1", "text": "plan a trip"},
        _p({"type": "message-start", "messageId": "a-1"}),
        _p({"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "planner", "input": {}}),
        _p({"type": "message-start", "messageId": "p-1"}, "c-1"),
        *_say("p-1", "Booking ", "flights.", within="c-1"),
        _p({"type": "tool-call", "messageId": "p-1", "id": "c-2", "name": "flights", "input": {"to": "LIS"}}, "c-1"),
        _p({"type": "message-start", "messageId": "f-1"}, "c-2"),
        *_say("f-1", "Found 3.", within="c-2"),
        _p({"type": "finish", "reason": "stop"}, "c-2"),
        _p({"type": "tool-result", "id": "c-2", "output": [1, 2, 3]}, "c-1"),
        _p({"type": "tool-call", "messageId": "p-1", "id": "c-3", "name": "hotels", "input": {}}, "c-1"),
        _p({"type": "error", "error": "hotel site down", "code": "network"}, "c-1"),
        _p({"type": "tool-result", "id": "c-1", "output": {"plan": "flights only"}}),
        *_say("a-1", "Flights ", "booked."),
        _p({"type": "tool-call", "messageId": "a-1", "id": "c-4", "name": "planner", "input": {"again": True}}),
        _p({"type": "message-start", "messageId": "p-2"}, "c-4"),
        {"type": "stop"},
    ]
    s["streaming"] = [
        {"type": "send", "id": "u-1", "text": "still going"},
        _p({"type": "message-start", "messageId": "a-1"}),
        *_say("a-1", "Some ", "words"),
    ]
    return s


SESSIONS = _sessions()


def _cases(protocol: int) -> list[dict[str, Any]]:
    """One case per recorded turn: the stream a live client got, and the reply it must rebuild."""
    cases = []
    for name, actions in SESSIONS.items():
        turns = turns_of(actions)
        before = list(turns[0])
        for k, turn in enumerate(turns[1:], 1):
            encoder = UIMessageStreamEncoder(fold_json(None, before), protocol=protocol)
            chunks = [c for action in turn for c in encoder.feed(action)]
            before += turn
            expected = session_ui_messages(before, protocol)
            reply = expected[-1] if expected and expected[-1]["role"] == "assistant" else None
            errored = any(a["type"] == "part" and a["part"]["type"] == "error" and "within" not in a for a in turn)
            cases.append({
                "name": f"{name}#{k}", "sse": b"".join(sse(chunks)).decode(), "message": None,
                "expected": reply, "errored": errored, "chunks": chunks, "ended": encoder.ended,
            })
    return cases


def _without_approval_answers(message: dict[str, Any] | None) -> dict[str, Any] | None:
    """The reply without the approval record the live client keeps once a call was approved
    (the stored state no longer says the call ever waited; docs/ai-sdk.md)."""
    if message is None:
        return None
    parts = []
    for part in message["parts"]:
        if "approval" in part and part["approval"].get("approved") is True:
            part = {k: v for k, v in part.items() if k != "approval"}
        parts.append(part)
    return {**message, "parts": parts}


@pytest.mark.parametrize(("protocol", "major"), [*MAJORS, (6, "ai7")])
def test_the_ai_package_accepts_every_chunk_and_rebuilds_every_stored_reply(protocol: int, major: str) -> None:
    cases = _cases(protocol)
    results = run_node("judge.mjs", major, payload=[{k: c[k] for k in ("name", "sse", "message")} for c in cases])
    assert len(results) == len(cases) >= 18
    approvals = 0
    for case, result in zip(cases, results, strict=True):
        assert result["invalid"] == [], case["name"]
        assert result["count"] == len(case["chunks"]), case["name"]
        assert bool(result["errors"]) == case["errored"], (case["name"], result["errors"])
        rebuilt = result["message"]
        if protocol >= 6 and rebuilt is not None:
            approvals += sum(1 for p in rebuilt["parts"] if p.get("approval", {}).get("approved"))
            rebuilt = _without_approval_answers(rebuilt)
        assert rebuilt == case["expected"], case["name"]
    # The demo's confirmed call: only 6+ hears of the approval at all.
    assert approvals == (1 if protocol >= 6 else 0)


def test_protocol_5_sends_only_ai5_chunk_types_and_6_adds_approvals() -> None:
    types5 = {c["type"] for case in _cases(5) for c in case["chunks"]}
    types6 = {c["type"] for case in _cases(6) for c in case["chunks"]}
    assert not any(t.startswith("tool-approval") for t in types5)
    assert types6 - types5 == {"tool-approval-request", "tool-approval-response"}
    assert {"start", "start-step", "finish-step", "text-start", "text-delta", "text-end", "reasoning-start",
            "reasoning-delta", "reasoning-end", "tool-input-available", "tool-output-available",
            "tool-output-error", "finish", "abort", "error", "data-agent", "data-error"} <= types5


def test_the_turn_ends_with_finish_error_or_stop_and_not_before() -> None:
    for case in _cases(5):
        last = case["chunks"][-1]["type"] if case["chunks"] else None
        if case["name"] == "streaming#1" or case["name"] == "confirm#2":
            assert not case["ended"] and last != "finish"
        else:
            assert case["ended"], case["name"]
            assert last in {"finish", "abort", "error"}, case["name"]


def test_a_nested_run_is_one_data_part_keyed_by_the_call() -> None:
    chunks = [c for case in _cases(5) if case["name"] == "nested#1" for c in case["chunks"]]
    agents = [c for c in chunks if c["type"] == "data-agent"]
    assert {c["id"] for c in agents} == {"c-1", "c-4"}
    last = [c for c in agents if c["id"] == "c-1"][-1]["data"]
    assert last["status"] == "error" and last["error"] == {"message": "hotel site down", "code": "network"}
    # The stop cancelled the nested call still open in c-4's run: the client hears of it.
    reply = session_ui_messages(SESSIONS["nested"])[-1]
    agent_parts = [p for p in reply["parts"] if p["type"] == "data-agent"]
    assert [p["id"] for p in agent_parts] == ["c-1", "c-4"]


def test_error_codes_reach_the_client_as_a_transient_data_chunk() -> None:
    chunks = [c for case in _cases(5) if case["name"] == "errors#1" for c in case["chunks"]]
    assert chunks == [
        {"type": "data-error", "data": {"message": "Too many requests.", "code": "rate_limited"}, "transient": True},
        {"type": "error", "errorText": "Too many requests."},
    ]


def test_a_retry_replays_what_it_keeps_of_the_reply_under_the_same_message_id() -> None:
    chunks = [c for case in _cases(5) if case["name"] == "errors#3" for c in case["chunks"]]
    assert chunks[0] == {"type": "start", "messageId": "a-1"}
    assert {"type": "tool-output-available", "toolCallId": "c-1", "output": "found"} in chunks
    # The partial text after the finished call is dropped by the retry, so never replayed.
    assert not any("Partial" in c.get("delta", "") for c in chunks)


def test_the_sse_framing_headers_and_chunk_order() -> None:
    assert UI_MESSAGE_STREAM_HEADERS["x-vercel-ai-ui-message-stream"] == "v1"
    assert UI_MESSAGE_STREAM_HEADERS["content-type"] == "text/event-stream"
    assert list(sse([{"type": "start", "messageId": "m"}])) == [
        b'data: {"type":"start","messageId":"m"}\n\n', b"data: [DONE]\n\n"]
    assert list(sse([], done=False)) == []
    for case in _cases(7):
        assert all(next(iter(c)) == "type" for c in case["chunks"])


def test_turns_of_splits_at_every_send_and_retry() -> None:
    actions = SESSIONS["errors"]
    turns = turns_of(actions)
    assert turns[0] == []
    assert [t[0]["type"] for t in turns[1:]] == ["send", "retry", "retry"]
    assert [a for t in turns for a in t] == actions
    prefix = [_p({"type": "message-start", "messageId": "x"})]
    assert turns_of(prefix + actions)[0] == prefix
    assert turns_of([]) == [[]]


def test_to_ui_messages_merges_a_turns_messages_and_keeps_the_users_ids() -> None:
    messages = session_ui_messages(SESSIONS["tools"])
    assert [(m["id"], m["role"]) for m in messages] == [
        ("u-1", "user"), ("a-1", "assistant"), ("u-2", "user"), ("a-3", "assistant")]
    assert [p["type"] for p in messages[1]["parts"]].count("step-start") == 2
    state = fold_json(None, SESSIONS["streaming"])
    assert to_ui_messages(state)[-1]["parts"][-1] == {"type": "text", "text": "Some words", "state": "streaming"}


@pytest.mark.parametrize("protocol", [4, 0, "5", True, 5.0])
def test_a_protocol_below_5_or_not_an_integer_is_refused(protocol: Any) -> None:
    with pytest.raises(InvalidEvent):
        UIMessageStreamEncoder(None, protocol=protocol)
    with pytest.raises(InvalidEvent):
        to_ui_messages({"messages": [], "status": "idle"}, protocol=protocol)


def test_importing_eventstore_does_not_import_the_adapter() -> None:
    code = "import sys, eventstore; eventstore.EventStore; assert 'eventstore.integrations.ai_sdk' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_documented_back_end_runs_as_written(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    from pathlib import Path

    from starlette.testclient import TestClient

    from eventstore import EventStore

    doc = (Path(__file__).resolve().parents[1] / "docs" / "ai-sdk.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(.*?)```", doc, flags=re.DOTALL)
    url = f"sqlite:///{tmp_path / 'chat.db'}"
    monkeypatch.setenv("EVENTSTORE_URL", url)
    scope: dict[str, Any] = {"__name__": "__doc__"}
    exec(compile(code, "docs/ai-sdk.md", "exec"), scope)  # noqa: S102 - the doc runs as written
    user = {"id": "u-1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}
    with TestClient(scope["app"]) as client:
        r = client.post("/api/chat", json={"id": "s1", "messages": [user], "trigger": "submit-message"})
    assert r.status_code == 200 and r.headers["x-vercel-ai-ui-message-stream"] == "v1"
    (result,) = run_node("judge.mjs", "ai5", payload=[{"name": "doc", "sse": r.text, "message": None}])
    assert result["invalid"] == [] and result["errors"] == []
    with EventStore(url) as store:
        assert to_ui_messages(store.load("s1")) == [user, result["message"]]
