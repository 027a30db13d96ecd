"""The wire models: every wire shape of docs/format.md parses and round-trips; malformed input is refused
with an InvalidEvent that names the field and the problem."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from eventstore.errors import InvalidEvent
from eventstore.core.models import (
    ACTION_TYPES,
    PART_TYPES,
    ErrorPart,
    FinishPart,
    MessageStartPart,
    PartAction,
    SendAction,
    SessionState,
    ToolPhaseAction,
    ToolResultPart,
    parse_action,
    parse_action_json,
    parse_actions,
)

WIRE_ACTIONS: list[dict[str, Any]] = [
    {"type": "send", "id": "u-1", "text": "Add two mugs to the cart"},
    {"type": "part", "part": {"type": "message-start", "messageId": "a-1"}},
    {"type": "part", "part": {"type": "message-start", "messageId": "a-1"}, "within": "call-7"},
    {"type": "toolPhase", "name": "add_to_cart", "state": "running"},
    {"type": "toolPhase", "name": "add_to_cart", "state": "awaiting-confirmation", "prompt": "Add?"},
    {"type": "stop"},
    {"type": "retry"},
    {"type": "reset"},
    {"type": "part", "part": {"type": "text-delta", "messageId": "a-1", "text": "Hel"}},
    {"type": "part", "part": {"type": "reasoning", "messageId": "a-1", "text": "..."}},
    {"type": "part", "part": {"type": "tool-call", "messageId": "a-1", "id": "call-1", "name": "add_to_cart", "input": {"slug": "mug"}}},
    {"type": "part", "part": {"type": "tool-result", "id": "call-1", "output": {"ok": True, "n": [1, 2.5, None]}}},
    {"type": "part", "part": {"type": "tool-result", "id": "call-1", "output": None}},
    {"type": "part", "part": {"type": "tool-error", "id": "call-1", "error": {"code": "cancelled"}}},
    {"type": "part", "part": {"type": "tool-error", "id": "call-1", "error": None}},
    {"type": "part", "part": {"type": "step-finish"}},
    {"type": "part", "part": {"type": "finish"}},
    {"type": "part", "part": {"type": "finish", "reason": "stop"}},
    {"type": "part", "part": {"type": "finish", "reason": "aborted"}},
    {"type": "part", "part": {"type": "finish", "reason": "length"}},
    {"type": "part", "part": {"type": "error", "error": "Couldn't reach the assistant.", "code": "network"}},
    {"type": "part", "part": {"type": "error", "error": "x"}},
]


@pytest.mark.parametrize("action", WIRE_ACTIONS, ids=lambda a: a.get("part", {}).get("type", a["type"]))
def test_every_spec_shape_parses_and_round_trips_exactly(action: dict[str, Any]) -> None:
    model = parse_action(action)
    assert model.to_json() == action
    assert parse_action(model) is model  # an already validated model passes through


@pytest.mark.parametrize("code", ["chat_disabled", "rate_limited", "bad_request", "network"])
def test_error_part_accepts_the_four_spec_codes(code: str) -> None:
    assert parse_action({"type": "part", "part": {"type": "error", "error": "e", "code": code}})


@pytest.mark.parametrize(
    ("bad", "field", "words"),
    [
        ({"type": "teleport"}, "type", "unknown action type 'teleport'; valid types: send, part"),
        ({"id": "u"}, "type", "missing 'type'"),
        ({"type": "part", "part": {"type": "smoke"}}, "part.type", "unknown stream part type 'smoke'"),
        ({"type": "part", "part": {"messageId": "a"}}, "part.type", "missing 'type'"),
        ({"type": "part", "part": {"type": "text-delta", "text": "x"}}, "part.messageId", "required field is missing"),
        ({"type": "part", "part": {"type": "text-delta", "messageId": "a", "text": 5}}, "part.text", "expected a string, got number"),
        ({"type": "send", "id": "u", "text": None}, "text", "expected a string, got null"),
        ({"type": "send", "id": 1, "text": "x"}, "id", "expected a string"),
        ({"type": "send", "id": "u", "text": "x", "extra": 1}, "extra", "unknown field"),
        ({"type": "stop", "now": True}, "now", "unknown field"),
        ({"type": "part", "part": {"type": "text-delta", "message_id": "a", "text": "x"}}, "part.messageId", "required"),
        ({"type": "part", "part": {"type": "tool-call", "messageId": "a", "id": "c", "name": "n"}}, "part.input", "required"),
        ({"type": "part", "part": {"type": "tool-result", "id": "c"}}, "part.output", "required"),
        ({"type": "part", "part": {"type": "error", "error": "e", "code": "teapot"}}, "part.code", "'network'"),
        ({"type": "part", "part": {"type": "error", "error": {"m": 1}}}, "part.error", "expected a string"),
        ({"type": "part", "part": {"type": "finish", "reason": 3}}, "part.reason", "expected a string"),
        ({"type": "toolPhase", "name": "t", "state": "done"}, "state", "'running' or 'awaiting-confirmation'"),
        ({"type": "part", "part": "text"}, "part", "expected an object, got string"),
        ({"type": "part", "part": {"type": "step-finish"}, "within": 7}, "within", "expected a string"),
        ({"type": "send", "id": "u", "text": True}, "text", "expected a string, got boolean"),
    ],
)
def test_malformed_actions_name_the_field_and_the_problem(bad: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidEvent) as exc:
        parse_action(bad)
    assert exc.value.field == field
    assert words in exc.value.reason
    assert field in str(exc.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_anywhere(value: float) -> None:
    deep = {"type": "part", "part": {"type": "tool-call", "messageId": "a", "id": "c", "name": "n", "input": {"xs": [1, {"v": value}]}}}
    with pytest.raises(InvalidEvent) as exc:
        parse_action(deep)
    assert exc.value.field == "part.input.xs.1.v"
    out = {"type": "part", "part": {"type": "tool-result", "id": "c", "output": value}}
    with pytest.raises(InvalidEvent, match="NaN and Infinity"):
        parse_action(out)


def test_lone_surrogates_are_refused_in_values_and_keys() -> None:
    with pytest.raises(InvalidEvent) as exc:
        parse_action({"type": "send", "id": "u", "text": "bad \ud800"})
    assert exc.value.field == "text" and "surrogate" in exc.value.reason
    with pytest.raises(InvalidEvent, match="surrogate"):
        parse_action({"type": "part", "part": {"type": "tool-result", "id": "c", "output": {"\udfff": 1}}})


@pytest.mark.parametrize(
    "value",
    [(1, 2), {1, 2}, b"bytes", object(), {1: "int key"}, 2**64],
    ids=["tuple", "set", "bytes", "object", "int-key", "huge-int"],
)
def test_non_json_values_are_refused(value: Any) -> None:
    with pytest.raises(InvalidEvent) as exc:
        parse_action({"type": "part", "part": {"type": "tool-result", "id": "c", "output": value}})
    assert exc.value.field is not None and exc.value.field.startswith("part.output")


@pytest.mark.parametrize("bad", ["send", 5, None, ["type", "send"]])
def test_non_objects_are_refused(bad: Any) -> None:
    with pytest.raises(InvalidEvent, match="must be a JSON object"):
        parse_action(bad)


def test_parse_actions_sets_the_index_of_the_offending_action() -> None:
    good = WIRE_ACTIONS[0]
    assert [a.to_json() for a in parse_actions([good, good])] == [good, good]
    with pytest.raises(InvalidEvent) as exc:
        parse_actions([good, good, {"type": "send", "id": "u"}])
    assert exc.value.index == 2 and exc.value.field == "text"
    assert "action #2" in str(exc.value)


def test_parse_action_json_decodes_and_validates() -> None:
    assert parse_action_json(b'{"type": "stop"}').to_json() == {"type": "stop"}
    assert parse_action_json('{"type": "retry"}').to_json() == {"type": "retry"}
    with pytest.raises(InvalidEvent, match="malformed JSON"):
        parse_action_json(b'{"type": "stop"')
    with pytest.raises(InvalidEvent, match="malformed JSON"):
        parse_action_json(b'{"type": "part", "part": {"type": "tool-result", "id": "c", "output": NaN}}')
    with pytest.raises(InvalidEvent) as exc:
        parse_action_json(b'{"type": "send"}')
    assert exc.value.field == "id"


def test_models_can_be_built_in_python_by_field_name() -> None:
    a = PartAction(part=MessageStartPart(message_id="a-1"), within="c")
    assert a.to_json() == {"type": "part", "part": {"type": "message-start", "messageId": "a-1"}, "within": "c"}
    assert PartAction(part=ToolResultPart(id="c", output=None)).to_json()["part"] == {"type": "tool-result", "id": "c", "output": None}
    assert PartAction(part=FinishPart()).to_json() == {"type": "part", "part": {"type": "finish"}}
    assert ErrorPart(error="x").to_json() == {"type": "error", "error": "x"}
    assert ToolPhaseAction(name="t", state="running").to_json() == {"type": "toolPhase", "name": "t", "state": "running"}
    assert SendAction(id="u", text="hi") == parse_action({"type": "send", "id": "u", "text": "hi"})


def test_action_models_are_frozen() -> None:
    a = SendAction(id="u", text="hi")
    with pytest.raises(ValidationError):
        a.text = "changed"  # type: ignore[misc]


def test_type_lists_match_the_spec() -> None:
    assert ACTION_TYPES == ("send", "part", "toolPhase", "stop", "retry", "reset")
    assert len(PART_TYPES) == 9


# --------------------------------------------------------------------------- state

STATE = {
    "messages": [
        {"id": "u-1", "role": "user", "parts": [{"type": "text", "text": "Add two mugs"}]},
        {
            "id": "a-1",
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "text": "..."},
                {"type": "text", "text": "Sure."},
                {
                    "type": "tool",
                    "id": "call-1",
                    "name": "delegate",
                    "input": {"slug": "mug"},
                    "state": "done",
                    "output": None,
                    "prompt": "OK?",
                    "agent": {
                        "messages": [
                            {"id": "n", "role": "assistant", "parts": [
                                {"type": "tool", "id": "c2", "name": "t", "input": None, "state": "error", "error": "e"}
                            ]}
                        ],
                        "status": "error",
                        "error": {"message": "sub", "code": "bad_request"},
                    },
                },
            ],
        },
    ],
    "status": "error",
    "error": {"message": "...", "code": "network"},
}


def test_state_validates_the_full_spec_shape_and_round_trips() -> None:
    s = SessionState.model_validate(STATE)
    assert s.to_json() == STATE
    assert SessionState.model_validate(orjson.loads(orjson.dumps(s.to_json()))) == s
    assert SessionState.from_trusted(STATE) == s


def test_state_to_json_omits_error_when_unset() -> None:
    s = SessionState.model_validate({"messages": [], "status": "idle"})
    assert s.to_json() == {"messages": [], "status": "idle"}
    assert s.error is None


def test_state_messages_are_plain_dicts() -> None:
    s = SessionState.model_validate(STATE)
    assert type(s.messages[0]) is dict
    assert type(s.messages[1]["parts"][2]["agent"]) is dict


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.update(status="thinking"),
        lambda s: s.update(extra=1),
        lambda s: s["messages"][0].update(role="system"),
        lambda s: s["messages"][0]["parts"].append({"type": "image"}),
        lambda s: s["messages"][1]["parts"][2].update(state="paused"),
        lambda s: s["messages"][1]["parts"][2].update(output=float("nan")),
        lambda s: s["messages"][1]["parts"][1].update(text=5),
        lambda s: s["messages"][1]["parts"][1].update(bold=True),
        lambda s: s["error"].update(code="teapot"),
        lambda s: s["messages"][1]["parts"][2]["agent"].update(status="done"),
    ],
    ids=["status", "extra-key", "role", "part-type", "tool-state", "nan", "text-int", "part-extra", "code", "agent-status"],
)
def test_state_validation_refuses_what_the_spec_does_not_allow(mutate: Any) -> None:
    import copy

    bad = copy.deepcopy(STATE)
    mutate(bad)
    with pytest.raises(ValidationError):
        SessionState.model_validate(bad)


def test_state_is_frozen() -> None:
    s = SessionState.model_validate(STATE)
    with pytest.raises(ValidationError):
        s.status = "idle"  # type: ignore[misc]


def test_a_malformed_state_raises_invalid_state_naming_the_field() -> None:
    from eventstore import InvalidState, session_reducer

    bad = {"messages": [{"id": "u-1", "role": "user", "parts": [{"type": "text", "text": 5}]}],
           "status": "idle"}
    with pytest.raises(InvalidState) as info:
        session_reducer(bad, {"type": "stop"})
    assert info.value.field is not None and info.value.field.startswith("messages.0.parts.0")
    with pytest.raises(InvalidState):
        session_reducer({"messages": [], "status": "paused"}, {"type": "stop"})
    with pytest.raises(InvalidState):
        session_reducer([], {"type": "stop"})  # type: ignore[arg-type]
