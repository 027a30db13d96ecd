"""Session messages as OpenAI / Anthropic chat message lists (pure)."""

from __future__ import annotations

import pytest

from eventstore import InvalidEvent, fold, resumable, to_anthropic_messages, to_openai_messages

ACTIONS = [
    {"type": "send", "id": "u-1", "text": "Add two mugs"},
    {"type": "part", "part": {"type": "message-start", "messageId": "a-1"}},
    {"type": "part", "part": {"type": "reasoning", "messageId": "a-1", "text": "search first"}},
    {"type": "part", "part": {"type": "text-delta", "messageId": "a-1", "text": "Looking."}},
    {"type": "part", "part": {"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "search", "input": {"q": "mug"}}},
    {"type": "part", "part": {"type": "tool-result", "id": "c-1", "output": {"hits": 2}}},
    {"type": "part", "part": {"type": "tool-call", "messageId": "a-1", "id": "c-2", "name": "pay", "input": {}}},
    {"type": "part", "part": {"type": "tool-error", "id": "c-2", "error": "card declined"}},
    {"type": "part", "part": {"type": "tool-call", "messageId": "a-1", "id": "c-3", "name": "cart", "input": {}}},
    {"type": "part", "part": {"type": "error", "error": "The response was interrupted."}},
]  # fmt: skip


def test_openai_messages_carry_finished_calls_and_their_results() -> None:
    msgs = resumable(fold(ACTIONS).messages)
    out = to_openai_messages(msgs, system="be brief")
    assert out[0] == {"role": "system", "content": "be brief"}
    assert out[1] == {"role": "user", "content": "Add two mugs"}
    assistant = out[2]
    assert assistant["role"] == "assistant" and assistant["content"] == "Looking."
    assert [c["id"] for c in assistant["tool_calls"]] == ["c-1", "c-2"]  # c-3 never finished
    assert assistant["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q":"mug"}'}
    assert out[3:] == [
        {"role": "tool", "tool_call_id": "c-1", "content": '{"hits":2}'},
        {"role": "tool", "tool_call_id": "c-2", "content": "card declined"},
    ]


def test_anthropic_messages_alternate_roles_with_tool_results_as_user_blocks() -> None:
    msgs = resumable(fold(ACTIONS + [{"type": "send", "id": "u-2", "text": "Retry"}]).messages)
    out = to_anthropic_messages(msgs)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[1]["content"][0] == {"type": "text", "text": "Looking."}
    assert [b["id"] for b in out[1]["content"] if b["type"] == "tool_use"] == ["c-1", "c-2"]  # c-3 was cancelled
    results = [b for b in out[2]["content"] if b["type"] == "tool_result"]
    assert [(b["tool_use_id"], b.get("is_error", False)) for b in results] == [("c-1", False), ("c-2", True)]
    assert out[2]["content"][-1] == {"type": "text", "text": "Retry"}  # merged into the same user turn


@pytest.mark.parametrize("bad", [None, "text", {"role": "user"}, [{"role": "system", "parts": []}], [3]])
def test_bad_messages_are_refused(bad: object) -> None:
    for fn in (to_openai_messages, to_anthropic_messages):
        with pytest.raises(InvalidEvent):
            fn(bad)
