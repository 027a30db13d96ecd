"""The reducer, behaviour by behaviour: every rule of docs/format.md ("The reducer"), every
row of its two tables, and its worked example."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from eventstore.errors import InvalidEvent
from eventstore.core.models import PartAction, SendAction, SessionState, TextDeltaPart, ToolPhaseAction
from eventstore.core.reducer import (
    REDUCER_VERSION,
    apply_action,
    fold,
    fold_json,
    initial_state,
    is_cancelled,
    resumable,
    session_reducer,
)
from eventstore.samples import chat_session, demo_conversation

# --------------------------------------------------------------------------- helpers


def part(p: dict[str, Any], within: str | None = None) -> dict[str, Any]:
    a: dict[str, Any] = {"type": "part", "part": p}
    if within is not None:
        a["within"] = within
    return a


def send(id: str = "u-1", text: str = "hi") -> dict[str, Any]:
    return {"type": "send", "id": id, "text": text}


def start(mid: str, within: str | None = None) -> dict[str, Any]:
    return part({"type": "message-start", "messageId": mid}, within)


def delta(mid: str, text: str, within: str | None = None) -> dict[str, Any]:
    return part({"type": "text-delta", "messageId": mid, "text": text}, within)


def call(mid: str, cid: str, name: str = "add_to_cart", within: str | None = None, input: Any = None) -> dict[str, Any]:
    return part(
        {"type": "tool-call", "messageId": mid, "id": cid, "name": name, "input": input or {}}, within
    )


def result(cid: str, output: Any = "ok", within: str | None = None) -> dict[str, Any]:
    return part({"type": "tool-result", "id": cid, "output": output}, within)


def tool_error(cid: str, error: Any, within: str | None = None) -> dict[str, Any]:
    return part({"type": "tool-error", "id": cid, "error": error}, within)


def finish(reason: str | None = None, within: str | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"type": "finish"}
    if reason is not None:
        p["reason"] = reason
    return part(p, within)


def error(msg: str = "boom", code: str | None = None, within: str | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"type": "error", "error": msg}
    if code is not None:
        p["code"] = code
    return part(p, within)


def phase(name: str, state: str, prompt: str | None = None) -> dict[str, Any]:
    a: dict[str, Any] = {"type": "toolPhase", "name": name, "state": state}
    if prompt is not None:
        a["prompt"] = prompt
    return a


def run(*actions: dict[str, Any]) -> SessionState:
    return fold(actions)


def msg(state: SessionState, mid: str) -> dict[str, Any]:
    [m] = [m for m in state.messages if m["id"] == mid]
    return m


def tool(state: SessionState | dict[str, Any], cid: str) -> dict[str, Any]:
    """The (last) tool part with this id anywhere in the state, nested included."""
    found: list[dict[str, Any]] = []

    def walk(messages: list[Any]) -> None:
        for m in messages:
            for p in m["parts"]:
                if p["type"] == "tool":
                    if p["id"] == cid:
                        found.append(p)
                    if "agent" in p:
                        walk(p["agent"]["messages"])

    walk(state.messages if isinstance(state, SessionState) else state["messages"])
    assert found, f"no tool part {cid}"
    return found[-1]


def step_same(state: SessionState, action: dict[str, Any]) -> bool:
    return session_reducer(state, action) is state


# --------------------------------------------------------------------------- the reference example (docs/format.md)


def test_reference_example_ends_in_error_and_resumes_through_finished_call() -> None:
    state: Any = {"messages": [], "status": "idle"}
    state = session_reducer(state, send("u-1", "Add two mugs to the cart"))
    for p in [
        {"type": "message-start", "messageId": "a-1"},
        {"type": "tool-call", "messageId": "a-1", "id": "call-1", "name": "add_to_cart", "input": {"slug": "mug", "qty": 2}},
        {"type": "tool-result", "id": "call-1", "output": {"content": [{"type": "text", "text": "Added."}]}},
        {"type": "error", "error": "Couldn't reach the assistant.", "code": "network"},
    ]:
        state = session_reducer(state, {"type": "part", "part": p})
    assert state.status == "error"
    assert state.error == {"message": "Couldn't reach the assistant.", "code": "network"}
    kept = resumable(state.messages)
    assert len(kept) == 2
    assert [m["id"] for m in kept] == ["u-1", "a-1"]


# --------------------------------------------------------------------------- actions table


def test_initial_state_is_empty_and_idle() -> None:
    assert initial_state().to_json() == {"messages": [], "status": "idle"}


def test_send_appends_user_message_with_one_text_part() -> None:
    s = run(send("u-1", "Add two mugs"))
    assert s.messages == [{"id": "u-1", "role": "user", "parts": [{"type": "text", "text": "Add two mugs"}]}]


def test_send_sets_status_streaming() -> None:
    assert run(send()).status == "streaming"


def test_send_clears_error() -> None:
    s = run(send(), start("a"), error("down", "network"))
    assert s.error is not None
    s = session_reducer(s, send("u-2"))
    assert s.error is None and s.status == "streaming"
    assert "error" not in s.to_json()


def test_part_applies_a_stream_part_to_the_session() -> None:
    s = run(send(), start("a-1"), delta("a-1", "Hi"))
    assert msg(s, "a-1")["parts"] == [{"type": "text", "text": "Hi"}]


def test_part_within_applies_to_the_calls_nested_messages() -> None:
    s = run(send(), start("a"), call("a", "c1", "delegate_to_x"), start("n", "c1"), delta("n", "sub", "c1"))
    agent = tool(s, "c1")["agent"]
    assert agent == {
        "messages": [{"id": "n", "role": "assistant", "parts": [{"type": "text", "text": "sub"}]}],
        "status": "streaming",
    }
    # The nested message is not a top-level message.
    assert [m["id"] for m in s.messages] == ["u-1", "a"]


def test_nested_finish_ends_only_the_nested_run_parent_stays_streaming() -> None:
    s = run(send(), start("a"), call("a", "c1"), start("n", "c1"), finish("stop", "c1"))
    assert tool(s, "c1")["agent"]["status"] == "idle"
    assert s.status == "streaming"


def test_nested_error_ends_only_the_nested_run() -> None:
    s = run(
        send(), start("a"), call("a", "c1"), start("n", "c1"), call("n", "c2", within="c1"),
        error("sub failed", "rate_limited", "c1"),
    )
    agent = tool(s, "c1")["agent"]
    assert agent["status"] == "error"
    assert agent["error"] == {"message": "sub failed", "code": "rate_limited"}
    assert tool(s, "c2")["state"] == "cancelled"  # nested open calls cancelled as at top level
    assert tool(s, "c1")["state"] == "running"  # the parent's call is untouched
    assert s.status == "streaming" and s.error is None


def test_nested_finish_aborted_cancels_only_nested_open_calls() -> None:
    s = run(send(), start("a"), call("a", "c1"), start("n", "c1"), call("n", "c2", within="c1"), finish("aborted", "c1"))
    assert tool(s, "c2")["state"] == "cancelled"
    assert tool(s, "c1")["state"] == "running"
    assert s.status == "streaming"


def test_nested_finish_without_abort_keeps_nested_open_calls() -> None:
    s = run(send(), start("a"), call("a", "c1"), start("n", "c1"), call("n", "c2", within="c1"), finish("stop", "c1"))
    assert tool(s, "c2")["state"] == "running"


def test_nothing_sets_a_nested_status_back_to_streaming() -> None:
    s = run(send(), start("a"), call("a", "c1"), start("n", "c1"), finish(within="c1"))
    s = fold([start("n2", "c1"), delta("n2", "x", "c1"), send("u-2")], s)
    assert tool(s, "c1")["agent"]["status"] == "idle"
    s = fold([error("e", within="c1"), start("n3", "c1")], s)
    assert tool(s, "c1")["agent"]["status"] == "error"


@pytest.mark.parametrize("end", [{"type": "stop"}, finish("aborted"), finish("stop"), error("x")])
def test_top_level_end_leaves_nested_statuses_alone(end: dict[str, Any]) -> None:
    s = run(send(), start("a"), call("a", "c1"), start("n", "c1"), call("n", "c2", within="c1"), end)
    assert tool(s, "c1")["agent"]["status"] == "streaming"
    assert "error" not in tool(s, "c1")["agent"]


def test_within_a_nested_call_two_levels_deep() -> None:
    s = run(
        send(), start("a"), call("a", "c1", "delegate_to_planner"),
        start("n1", "c1"), call("n1", "c2", "delegate_to_shopper", within="c1"),
        start("n2", "c2"), delta("n2", "deep", "c2"), call("n2", "c3", "search", within="c2"),
        result("c3", {"hits": 3}, within="c2"), finish("stop", "c2"),
    )
    inner = tool(s, "c2")["agent"]
    assert inner["status"] == "idle"
    assert inner["messages"][0]["parts"][0] == {"type": "text", "text": "deep"}
    assert tool(s, "c3")["state"] == "done" and tool(s, "c3")["output"] == {"hits": 3}
    assert tool(s, "c1")["agent"]["status"] == "streaming"  # the middle run is untouched
    assert s.status == "streaming"


def test_tool_phase_sets_newest_open_call_state_and_prompt() -> None:
    s = run(send(), start("a"), call("a", "c1", "add_to_cart"), result("c1"), call("a", "c2", "add_to_cart"),
            phase("add_to_cart", "awaiting-confirmation", "Add 2 mugs?"))
    assert tool(s, "c2")["state"] == "awaiting-confirmation"
    assert tool(s, "c2")["prompt"] == "Add 2 mugs?"
    assert tool(s, "c1")["state"] == "done" and "prompt" not in tool(s, "c1")


def test_tool_phase_removes_prompt_when_the_action_has_none() -> None:
    s = run(send(), start("a"), call("a", "c1", "pay"), phase("pay", "awaiting-confirmation", "Pay?"), phase("pay", "running"))
    assert tool(s, "c1")["state"] == "running"
    assert "prompt" not in tool(s, "c1")


def test_tool_phase_prefers_the_newest_of_several_open_calls() -> None:
    s = run(send(), start("a"), call("a", "c1", "t"), call("a", "c2", "t"), phase("t", "awaiting-confirmation"))
    assert tool(s, "c1")["state"] == "running"
    assert tool(s, "c2")["state"] == "awaiting-confirmation"


def test_tool_phase_reaches_nested_calls() -> None:
    s = run(send(), start("a"), call("a", "c1", "delegate"), start("n", "c1"), call("n", "c2", "pay", within="c1"),
            phase("pay", "awaiting-confirmation", "OK?"))
    assert tool(s, "c2")["state"] == "awaiting-confirmation"


def test_tool_phase_newest_open_counts_nested_messages_right_after_their_call() -> None:
    # Document order: c1, then c1's nested c2, then c3 (after c1 in the same message).
    base = run(send(), start("a"), call("a", "c1", "t"), start("n", "c1"), call("n", "c2", "t", within="c1"))
    s = session_reducer(base, phase("t", "awaiting-confirmation"))
    assert tool(s, "c2")["state"] == "awaiting-confirmation"  # nested comes after its call
    assert tool(s, "c1")["state"] == "running"
    s = fold([call("a", "c3", "t"), phase("t", "awaiting-confirmation")], base)
    assert tool(s, "c3")["state"] == "awaiting-confirmation"  # a later sibling is newer still
    assert tool(s, "c2")["state"] == "running"


def test_tool_phase_skips_finished_calls_to_reach_an_older_open_one() -> None:
    s = run(send(), start("a"), call("a", "c1", "t"), call("a", "c2", "t"), result("c2"), phase("t", "awaiting-confirmation"))
    assert tool(s, "c1")["state"] == "awaiting-confirmation"
    assert tool(s, "c2")["state"] == "done"


@pytest.mark.parametrize("name", ["t", "other"])
def test_tool_phase_without_a_matching_open_call_returns_the_same_object(name: str) -> None:
    s = run(send(), start("a"), call("a", "c1", "t"), result("c1"))
    assert step_same(s, phase(name, "running"))


def test_stop_sets_idle_and_cancels_open_calls_nested_included() -> None:
    s = run(send(), start("a"), call("a", "c1", "done_one"), result("c1"), call("a", "c2", "t"),
            phase("t", "awaiting-confirmation"), call("a", "c3", "d"), start("n", "c3"), call("n", "c4", within="c3"),
            {"type": "stop"})
    assert s.status == "idle"
    assert [tool(s, c)["state"] for c in ("c1", "c2", "c3", "c4")] == ["done", "cancelled", "cancelled", "cancelled"]


def test_stop_keeps_the_error_and_errored_calls() -> None:
    s = run(send(), start("a"), call("a", "c1"), tool_error("c1", "nope"), {"type": "stop"})
    assert tool(s, "c1")["state"] == "error"


def test_stop_on_an_idle_session_without_open_calls_returns_the_same_object() -> None:
    s = run(send(), start("a"), finish())
    assert step_same(s, {"type": "stop"})


def test_retry_without_a_user_message_is_the_same_object() -> None:
    s = run(start("a"), delta("a", "x"), error("e"))
    assert step_same(s, {"type": "retry"})
    assert step_same(initial_state(), {"type": "retry"})


def test_retry_sets_streaming_clears_error_and_keeps_resumable_messages() -> None:
    s = run(send(), start("a"), call("a", "c1"), result("c1"), delta("a", "tail"), call("a", "c2"), error("down", "network"))
    r = session_reducer(s, {"type": "retry"})
    assert r.status == "streaming" and r.error is None
    assert r.messages == resumable(s.messages)
    assert [p.get("id") for p in msg(r, "a")["parts"]] == ["c1"]


def test_retry_after_an_error_mid_tool_call_resumes_after_the_finished_call() -> None:
    s = run(*demo_conversation()[: next(i for i, a in enumerate(demo_conversation()) if a["type"] == "retry") + 1])
    assert s.status == "streaming" and s.error is None
    last = s.messages[-1]
    assert last["id"] == "a-2"
    assert last["parts"][-1]["id"] == "call-3" and last["parts"][-1]["state"] == "done"
    # The cancelled checkout is gone; the earlier turn is intact.
    assert all(p.get("id") != "call-4" for m in s.messages for p in m["parts"])
    assert [m["id"] for m in s.messages] == ["u-1", "a-1", "u-2", "a-2"]


def test_demo_conversation_finishes_successfully() -> None:
    s = fold(demo_conversation())
    assert s.status == "idle" and s.error is None
    assert tool(s, "call-5")["state"] == "done"
    assert tool(s, "call-3")["agent"]["status"] == "idle"


def test_reset_goes_back_to_the_empty_session() -> None:
    s = run(send(), start("a"), error("x"), {"type": "reset"})
    assert s.to_json() == {"messages": [], "status": "idle"}


# --------------------------------------------------------------------------- stream parts table


def test_message_start_appends_an_empty_assistant_message() -> None:
    s = run(send(), start("a-1"))
    assert s.messages[-1] == {"id": "a-1", "role": "assistant", "parts": []}
    assert s.status == "streaming"


def test_text_delta_appends_to_the_last_text_part() -> None:
    s = run(send(), start("a"), delta("a", "Hel"), delta("a", "lo"))
    assert msg(s, "a")["parts"] == [{"type": "text", "text": "Hello"}]


@pytest.mark.parametrize(
    "between",
    [
        part({"type": "reasoning", "messageId": "a", "text": "think"}),
        call("a", "c1"),
    ],
)
def test_text_delta_adds_a_text_part_when_the_last_part_is_not_text(between: dict[str, Any]) -> None:
    s = run(send(), start("a"), delta("a", "one"), between, delta("a", "two"))
    parts = msg(s, "a")["parts"]
    assert parts[0] == {"type": "text", "text": "one"}
    assert parts[-1] == {"type": "text", "text": "two"}
    assert len(parts) == 3


def test_text_delta_into_an_empty_message_adds_a_text_part() -> None:
    s = run(send(), start("a"), delta("a", ""))
    assert msg(s, "a")["parts"] == [{"type": "text", "text": ""}]


def test_parts_apply_to_the_newest_message_with_that_id() -> None:
    s = run(send(), start("a"), delta("a", "old"), start("b"), start("a"), delta("a", "new"))
    assert [m["parts"] for m in s.messages[1:]] == [[{"type": "text", "text": "old"}], [], [{"type": "text", "text": "new"}]]


def test_text_delta_to_an_older_message_still_lands_there() -> None:
    s = run(send(), start("a"), delta("a", "x"), start("b"), delta("a", "y"))
    assert msg(s, "a")["parts"] == [{"type": "text", "text": "xy"}]
    assert msg(s, "b")["parts"] == []


def test_reasoning_always_adds_a_reasoning_part() -> None:
    r = {"type": "reasoning", "messageId": "a", "text": "r"}
    s = run(send(), start("a"), part(r), part(r))
    assert msg(s, "a")["parts"] == [{"type": "reasoning", "text": "r"}] * 2


def test_tool_call_adds_a_running_tool_part() -> None:
    s = run(send(), start("a"), call("a", "call-1", "add_to_cart", input={"slug": "mug"}))
    assert msg(s, "a")["parts"] == [
        {"type": "tool", "id": "call-1", "name": "add_to_cart", "input": {"slug": "mug"}, "state": "running"}
    ]


def test_tool_call_keeps_null_input() -> None:
    s = run(send(), start("a"), part({"type": "tool-call", "messageId": "a", "id": "c", "name": "n", "input": None}))
    assert "input" in tool(s, "c") and tool(s, "c")["input"] is None


@pytest.mark.parametrize("output", [{"content": [{"type": "text", "text": "Added."}]}, None, 0, "", []])
def test_tool_result_makes_the_call_done_with_its_output(output: Any) -> None:
    s = run(send(), start("a"), call("a", "c1"), result("c1", output))
    t = tool(s, "c1")
    assert t["state"] == "done"
    assert "output" in t and t["output"] == output
    assert "output" in s.to_json()["messages"][1]["parts"][0]


def test_tool_error_with_cancelled_code_makes_the_call_cancelled_and_keeps_the_error() -> None:
    s = run(send(), start("a"), call("a", "c1"), tool_error("c1", {"code": "cancelled", "message": "user"}))
    assert tool(s, "c1")["state"] == "cancelled"
    assert tool(s, "c1")["error"] == {"code": "cancelled", "message": "user"}


@pytest.mark.parametrize("err", ["failed", {"code": "timeout"}, None, {"message": "cancelled"}])
def test_tool_error_otherwise_makes_the_call_error_and_keeps_the_error(err: Any) -> None:
    s = run(send(), start("a"), call("a", "c1"), tool_error("c1", err))
    assert tool(s, "c1")["state"] == "error"
    assert "error" in tool(s, "c1") and tool(s, "c1")["error"] == err


def test_tool_result_applies_to_the_newest_call_with_that_id() -> None:
    s = run(send(), start("a"), call("a", "c"), result("c", 1), start("b"), call("b", "c"), result("c", 2))
    parts = [p for m in s.messages for p in m["parts"] if p["type"] == "tool"]
    assert [p["output"] for p in parts] == [1, 2]


def test_tool_result_reaches_a_nested_call_from_the_top_level() -> None:
    s = run(send(), start("a"), call("a", "c1"), start("n", "c1"), call("n", "c2", within="c1"), result("c2", "nested"))
    assert tool(s, "c2")["state"] == "done" and tool(s, "c2")["output"] == "nested"
    assert tool(s, "c1")["state"] == "running"


def test_tool_result_within_a_run_does_not_reach_calls_outside_it() -> None:
    s = run(send(), start("a"), call("a", "c1"), call("a", "c9"), start("n", "c1"))
    assert step_same(s, result("c9", within="c1"))


def test_step_finish_changes_nothing() -> None:
    s = run(send(), start("a"), delta("a", "x"))
    assert step_same(s, part({"type": "step-finish"}))


def test_finish_sets_idle_and_keeps_open_calls() -> None:
    s = run(send(), start("a"), call("a", "c1"), finish("stop"))
    assert s.status == "idle"
    assert tool(s, "c1")["state"] == "running"


def test_finish_without_reason_sets_idle() -> None:
    assert run(send(), finish()).status == "idle"


def test_finish_aborted_cancels_open_calls_nested_included() -> None:
    s = run(send(), start("a"), call("a", "c1"), start("n", "c1"), call("n", "c2", within="c1"), finish("aborted"))
    assert s.status == "idle"
    assert tool(s, "c1")["state"] == "cancelled" and tool(s, "c2")["state"] == "cancelled"


def test_finish_does_not_clear_the_error() -> None:
    s = run(send(), error("x"), finish())
    assert s.status == "idle" and s.error == {"message": "x"}


def test_error_sets_status_error_sets_error_and_cancels_open_calls() -> None:
    s = run(send(), start("a"), call("a", "c1"), call("a", "c2"), phase("add_to_cart", "awaiting-confirmation"),
            error("Couldn't reach the assistant.", "network"))
    assert s.status == "error"
    assert s.error == {"message": "Couldn't reach the assistant.", "code": "network"}
    assert tool(s, "c1")["state"] == "cancelled" and tool(s, "c2")["state"] == "cancelled"


def test_error_without_code_omits_code() -> None:
    s = run(send(), error("x"))
    assert s.to_json()["error"] == {"message": "x"}


def test_cancelling_leaves_finished_calls_alone() -> None:
    s = run(send(), start("a"), call("a", "c1"), result("c1"), call("a", "c2"), tool_error("c2", "e"),
            call("a", "c3"), tool_error("c3", {"code": "cancelled"}), error("x"))
    assert [tool(s, c)["state"] for c in ("c1", "c2", "c3")] == ["done", "error", "cancelled"]


def test_tool_result_replaces_a_previous_tool_error() -> None:
    s = run(send(), start("a"), call("a", "c1"), tool_error("c1", "e"), result("c1", "fine"))
    assert tool(s, "c1")["state"] == "done" and "error" not in tool(s, "c1")


# --------------------------------------------------------------------------- unknown ids (docs/format.md, "The reducer")


@pytest.mark.parametrize(
    "action",
    [
        delta("nope", "x"),
        part({"type": "reasoning", "messageId": "nope", "text": "r"}),
        call("nope", "c9"),
        result("nope"),
        tool_error("nope", "e"),
        start("m", "nope"),
        delta("a", "x", "nope"),
    ],
    ids=["text-delta", "reasoning", "tool-call", "tool-result", "tool-error", "within-start", "within-delta"],
)
def test_a_part_naming_an_unknown_id_changes_nothing(action: dict[str, Any]) -> None:
    s = run(send(), start("a"), call("a", "c1"))
    assert step_same(s, action)


def test_the_first_part_within_an_existing_call_creates_its_agent_even_if_it_changes_nothing() -> None:
    s = run(send(), start("a"), call("a", "c1"))
    r = session_reducer(s, delta("unknown", "x", "c1"))
    assert r is not s
    assert tool(r, "c1")["agent"] == {"messages": [], "status": "streaming"}
    # Once the agent exists, a no-op nested part is a no-op.
    assert step_same(r, delta("unknown", "x", "c1"))
    assert step_same(r, part({"type": "step-finish"}, "c1"))


def test_a_nested_runs_messages_are_its_own() -> None:
    s = run(send(), start("a"), call("a", "c1"), start("n", "c1"))
    assert step_same(s, delta("n", "top-level cannot see n"))
    assert step_same(s, delta("a", "c1's run cannot see a", "c1"))


def test_within_names_the_newest_call_with_that_id() -> None:
    s = run(send(), start("a"), call("a", "c"), start("b"), call("b", "c"), start("n", "c"))
    calls = [p for m in s.messages for p in m["parts"] if p["type"] == "tool"]
    assert "agent" not in calls[0] and "agent" in calls[1]


def test_within_follows_a_newer_call_with_the_same_id_inside_one_fold() -> None:
    # Exercises the fold's within-cache: a newer tool-call with the same id must win.
    s = run(send(), start("a"), call("a", "c"), start("n1", "c"), call("a", "c"), start("n2", "c"))
    calls = msg(s, "a")["parts"]
    assert [m["id"] for m in calls[0]["agent"]["messages"]] == ["n1"]
    assert [m["id"] for m in calls[1]["agent"]["messages"]] == ["n2"]


def test_fold_and_stepwise_agree_on_within_after_retry_and_reset() -> None:
    acts = [send(), start("a"), call("a", "c"), result("c"), start("n", "c"), call("a", "d"), start("x", "d"),
            error("e"), {"type": "retry"}, start("n2", "c"), start("y", "d"), {"type": "reset"}, start("z", "c")]
    stepwise = initial_state()
    for a in acts:
        stepwise = session_reducer(stepwise, a)
    assert fold(acts) == stepwise
    assert fold_json(None, acts) == stepwise.to_json()


# --------------------------------------------------------------------------- resumable


def U(id: str) -> dict[str, Any]:
    return {"id": id, "role": "user", "parts": [{"type": "text", "text": id}]}


def A(id: str, *parts: dict[str, Any]) -> dict[str, Any]:
    return {"id": id, "role": "assistant", "parts": list(parts)}


def T(id: str, state: str, **extra: Any) -> dict[str, Any]:
    return {"type": "tool", "id": id, "name": "t", "input": {}, "state": state, **extra}


TXT = {"type": "text", "text": "t"}


def test_resumable_keeps_through_the_last_finished_call_and_drops_what_follows() -> None:
    msgs = [U("u1"), A("a1", T("x", "done")), U("u2"), A("a2", TXT, T("c1", "done"), TXT, T("c2", "running")), A("a3", TXT)]
    out = resumable(msgs)
    assert [m["id"] for m in out] == ["u1", "a1", "u2", "a2"]
    assert out[-1]["parts"] == [TXT, T("c1", "done")]


def test_resumable_counts_an_errored_call_as_finished() -> None:
    msgs = [U("u"), A("a", T("c1", "done")), A("b", T("c2", "error", error="e"), TXT)]
    assert resumable(msgs) == [U("u"), A("a", T("c1", "done")), A("b", T("c2", "error", error="e"))]


@pytest.mark.parametrize("state", ["running", "awaiting-confirmation", "cancelled"])
def test_resumable_without_a_finished_call_returns_through_the_last_user_message(state: str) -> None:
    msgs = [U("u1"), A("a1", T("x", "done")), U("u2"), A("a2", TXT, T("c", state))]
    assert resumable(msgs) == msgs[:3]


def test_resumable_ignores_finished_calls_before_the_last_user_message() -> None:
    msgs = [U("u1"), A("a1", T("x", "done"), TXT), U("u2"), A("a2", TXT)]
    assert resumable(msgs) == msgs[:3]


def test_resumable_considers_top_level_tool_parts_only() -> None:
    nested = T("c", "running", agent={"messages": [A("n", T("inner", "done"))], "status": "idle"})
    msgs = [U("u"), A("a", nested, TXT)]
    assert resumable(msgs) == [U("u")]


def test_resumable_without_a_user_message_returns_the_messages_unchanged_in_a_new_list() -> None:
    msgs = [A("a", TXT, T("c", "running"))]
    out = resumable(msgs)
    assert out == msgs and out is not msgs
    assert resumable([]) == []


def test_resumable_never_mutates_and_shares_unchanged_messages() -> None:
    msgs = [U("u"), A("a", T("c1", "done"), TXT), A("b", TXT)]
    before = copy.deepcopy(msgs)
    out = resumable(msgs)
    assert msgs == before
    assert out[0] is msgs[0]
    assert out[1] is not msgs[1] and out[1]["parts"] == [T("c1", "done")]


def test_resumable_keeps_a_message_whole_when_the_call_is_its_last_part() -> None:
    msgs = [U("u"), A("a", TXT, T("c1", "done")), A("b", TXT)]
    out = resumable(msgs)
    assert out == msgs[:2] and out[1] is msgs[1]


# --------------------------------------------------------------------------- is_cancelled


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"code": "cancelled"}, True),
        ({"code": "cancelled", "message": "by user"}, True),
        ({"code": "CANCELLED"}, False),
        ({"message": "cancelled"}, False),
        ("cancelled", False),
        (None, False),
        (["cancelled"], False),
        (0, False),
    ],
)
def test_is_cancelled_means_an_object_whose_code_is_cancelled(value: Any, expected: bool) -> None:
    assert is_cancelled(value) is expected


def test_is_cancelled_accepts_objects_with_a_code_attribute() -> None:
    class Err(Exception):
        code = "cancelled"

    assert is_cancelled(Err()) is True


# --------------------------------------------------------------------------- purity and sharing


def test_session_reducer_never_mutates_its_inputs_and_shares_untouched_messages() -> None:
    s = run(send(), start("a"), delta("a", "x"), call("a", "c1"), start("b"), delta("b", "y"))
    snapshot = copy.deepcopy(s.to_json())
    action = delta("b", "z")
    action_copy = copy.deepcopy(action)
    r = session_reducer(s, action)
    assert s.to_json() == snapshot and action == action_copy
    assert msg(r, "b")["parts"] == [{"type": "text", "text": "yz"}]
    # Structural sharing: untouched messages are the same objects.
    assert r.messages[0] is s.messages[0] and r.messages[1] is s.messages[1]
    assert r.messages[2] is not s.messages[2]


def test_apply_action_copies_only_the_changed_path() -> None:
    state = run(send(), start("a"), delta("a", "x"), start("b"), delta("b", "y")).to_json()
    snapshot = copy.deepcopy(state)
    out = apply_action(state, delta("a", "!"))
    assert state == snapshot
    assert out is not state and out["messages"] is not state["messages"]
    assert out["messages"][2] is state["messages"][2]
    assert out["messages"][1]["parts"][0] == {"type": "text", "text": "x!"}


def test_apply_action_returns_the_same_object_when_nothing_changes() -> None:
    state = run(send(), start("a")).to_json()
    assert apply_action(state, part({"type": "step-finish"})) is state
    assert apply_action(state, phase("none", "running")) is state


def test_fold_json_never_mutates_its_input_state() -> None:
    base = fold_json(None, chat_session(3, seed=1))
    snapshot = copy.deepcopy(base)
    out = fold_json(base, chat_session(2, seed=2) + [{"type": "stop"}, {"type": "retry"}])
    assert base == snapshot
    assert out != base


@pytest.mark.parametrize(
    "tail",
    [
        [delta("a", "!")],
        [delta("a", "!"), delta("a", "?")],
        [delta("n", "!", "c1")],
        [start("b"), delta("a", "!")],
        [delta("a", "!"), {"type": "stop"}, {"type": "retry"}],
    ],
    ids=["one-delta", "two-deltas", "nested-delta", "older-message", "then-retry"],
)
def test_fold_json_extending_text_it_did_not_create_leaves_the_input_alone(tail: list[dict[str, Any]]) -> None:
    base = fold_json(None, [send(), start("a"), call("a", "c1"), start("n", "c1"), delta("n", "x", "c1"), delta("a", "x")])
    snapshot = copy.deepcopy(base)
    out = fold_json(base, tail)
    assert base == snapshot
    assert out != base
    assert out == fold(tail, base).to_json()


def test_fold_json_agrees_with_fold_on_a_long_session() -> None:
    actions = chat_session(5)
    assert fold_json(None, actions) == fold(actions).to_json()


def test_fold_json_without_actions_returns_the_input_state_itself() -> None:
    state = {"messages": [], "status": "idle"}
    assert fold_json(state, []) is state
    assert fold_json(None, []) == state


def test_fold_of_nothing_returns_the_same_state_object() -> None:
    s = run(send())
    assert fold([], s) is s
    assert fold([part({"type": "step-finish"})], s) is s


def test_fold_json_rejects_an_unknown_action_type() -> None:
    with pytest.raises(InvalidEvent) as exc:
        fold_json(None, [{"type": "teleport"}])
    assert exc.value.field == "type"


# --------------------------------------------------------------------------- API surface


def test_reducer_accepts_models_and_dicts_alike() -> None:
    as_dicts = [send("u", "hi"), start("a"), delta("a", "x"), phase("t", "running")]
    as_models = [
        SendAction(id="u", text="hi"),
        PartAction(part={"type": "message-start", "messageId": "a"}),
        PartAction(part=TextDeltaPart(message_id="a", text="x")),
        ToolPhaseAction(name="t", state="running"),
    ]
    assert fold(as_dicts) == fold(as_models)
    assert session_reducer({"messages": [], "status": "idle"}, as_models[0]) == fold(as_dicts[:1])


def test_session_reducer_refuses_a_malformed_action() -> None:
    with pytest.raises(InvalidEvent) as exc:
        session_reducer(initial_state(), {"type": "part", "part": {"type": "text-delta", "messageId": "a"}})
    assert exc.value.field == "part.text"


def test_fold_reports_the_index_of_a_malformed_action() -> None:
    with pytest.raises(InvalidEvent) as exc:
        fold([send(), {"type": "send", "id": "u", "text": 5}])
    assert exc.value.index == 1 and exc.value.field == "text"


def test_to_json_omits_unset_optional_keys() -> None:
    s = run(send(), start("a"), call("a", "c1"))
    j = s.to_json()
    assert set(j) == {"messages", "status"}
    assert set(j["messages"][1]["parts"][0]) == {"type", "id", "name", "input", "state"}


def test_reducer_version_is_a_positive_int() -> None:
    assert isinstance(REDUCER_VERSION, int) and REDUCER_VERSION >= 1


def test_chat_session_has_about_86_events_per_turn_and_ends_idle() -> None:
    actions = chat_session(50)
    assert 4200 <= len(actions) <= 4400
    assert chat_session(50) == actions  # deterministic
    s = fold_json(None, actions)
    assert s["status"] == "idle" and len(s["messages"]) == 150
