"""Hostile input is refused with little memory: deep nesting and oversized values.

A 50,000-deep object and a 50 MB string are refused with ``InvalidEvent`` on every entry
point (append, metadata, a streaming turn, JSON text, the CLI's file reader, import), and
the refusal itself allocates next to nothing (measured with ``tracemalloc``; the hostile
value is built before measuring starts).
"""

from __future__ import annotations

import io
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from eventstore import MAX_JSON_DEPTH, EventStore, InvalidEvent, check_json_text, parse_action, parse_action_json

pytestmark = pytest.mark.twins

DEEP = 50_000
HUGE = 50 << 20
#: Generous for a refusal that builds nothing: the values refused are 1000x bigger.
PEAK = 8 << 20


def _nested(depth: int) -> Any:
    value: Any = "x"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _tool_call(input_value: Any) -> dict[str, Any]:
    return {"type": "part", "part": {"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "t", "input": input_value}}


def _peak_of_refusal(call: Callable[[], Any]) -> tuple[int, InvalidEvent]:
    tracemalloc.start()
    try:
        with pytest.raises(InvalidEvent) as info:
            call()
        return tracemalloc.get_traced_memory()[1], info.value
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def deep() -> Any:
    return _nested(DEEP)


@pytest.fixture(scope="module")
def huge() -> str:
    return "x" * HUGE


def test_the_depth_limit_is_exact() -> None:
    # The action object is level 1, its part 2: an input may nest MAX_JSON_DEPTH - 2 levels.
    assert parse_action(_tool_call(_nested(MAX_JSON_DEPTH - 2)))
    with pytest.raises(InvalidEvent, match="nested more than"):
        parse_action(_tool_call(_nested(MAX_JSON_DEPTH - 1)))
    check_json_text("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    with pytest.raises(InvalidEvent):
        check_json_text("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    # Brackets inside strings (escaped quotes included) are text, not nesting.
    check_json_text(orjson.dumps({"t": '"\\' + "[" * 10_000}))


def test_deep_values_and_text_are_refused_with_little_memory(deep: Any) -> None:
    text = b'{"type":"part","part":{"type":"tool-call","messageId":"a","id":"c","name":"t","input":' + b"[" * DEEP + b"]" * DEEP + b"}}"
    for call in (
        lambda: parse_action(_tool_call(deep)),
        lambda: parse_action_json(text),
        lambda: check_json_text(text.decode()),
    ):
        peak, exc = _peak_of_refusal(call)
        assert "nested more than" in exc.reason
        assert peak < PEAK, peak


def test_the_cli_reader_refuses_deep_text_before_parsing(tmp_path: Any) -> None:
    from eventstore_cli.inputs import loads_strict

    text = "[" * DEEP + "]" * DEEP
    peak, _ = _peak_of_refusal(lambda: loads_strict(text))
    assert peak < PEAK, peak


def test_append_refuses_deep_actions_and_metadata_with_little_memory(store: EventStore, deep: Any) -> None:
    store.append("s", [{"type": "stop"}])
    for call in (
        lambda: store.append("s", [_tool_call(deep)]),
        lambda: store.append("s", [{"type": "stop"}], metadata={"deep": deep}),
    ):
        peak, exc = _peak_of_refusal(call)
        assert "nested more than" in exc.reason
        assert peak < PEAK, peak
    assert store.head("s") == 1


def test_append_refuses_huge_values_before_encoding_them(store: EventStore, huge: str) -> None:
    store.append("s", [{"type": "stop"}])
    for call in (
        lambda: store.append("s", [{"type": "send", "id": "u", "text": huge}]),
        lambda: store.append("s", [{"type": "stop"}, _tool_call({"blob": huge})]),
        lambda: store.append("s", [{"type": "stop"}], metadata={"note": huge}),
    ):
        peak, exc = _peak_of_refusal(call)
        assert "max_event_bytes" in exc.reason
        assert peak < PEAK, peak
    assert store.head("s") == 1


def test_a_turn_refuses_huge_and_deep_parts_before_encoding_them(store: EventStore, huge: str, deep: Any) -> None:
    with store.turn("s", {"type": "send", "id": "u-1", "text": "hi"}) as turn:
        for part in (
            {"type": "text-delta", "messageId": "a-1", "text": huge},
            {"type": "tool-call", "messageId": "a-1", "id": "c", "name": "t", "input": deep},
        ):
            peak, _ = _peak_of_refusal(lambda: turn.write(part))
            assert peak < PEAK, peak
        turn.write({"type": "finish"})
    peak, _ = _peak_of_refusal(lambda: store.turn("s", {"type": "send", "id": "u-2", "text": huge}).__enter__())
    assert peak < PEAK, peak


def test_import_refuses_a_deep_action_line_with_little_memory(store: EventStore) -> None:
    store.append("s", [{"type": "send", "id": "u", "text": "hi"}])
    out = io.StringIO()
    store.export("s", out)
    lines = out.getvalue().splitlines()
    event = orjson.loads(lines[-1])
    event["action"] = "DEEP"
    deep_action = '{"type":"part","part":{"type":"tool-result","id":"c","output":' + "[" * 900 + "]" * 900 + "}}"
    line = orjson.dumps(event).decode().replace('"DEEP"', deep_action)  # within orjson's own limit, beyond ours
    forged = "\n".join([*lines[:-1], line]).replace('"s"', '"t"') + "\n"  # as a new session
    peak, exc = _peak_of_refusal(lambda: store.import_(io.StringIO(forged)))
    assert "nested more than" in exc.reason
    assert peak < PEAK, peak
