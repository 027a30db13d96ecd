"""Property tests of the reducer (hypothesis): purity, determinism, fold laws, JSON round trip."""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import action_lists, actions

from eventstore.core.models import SessionState, parse_action
from eventstore.core.reducer import apply_action, fold, fold_json, initial_state, resumable, session_reducer
from eventstore.samples import random_actions

FAST = settings(max_examples=100, deadline=None)


def _stepwise(acts: list[dict[str, Any]], state: SessionState | None = None) -> list[SessionState]:
    states = [state or initial_state()]
    for a in acts:
        states.append(session_reducer(states[-1], a))
    return states


@FAST
@given(action_lists)
def test_session_reducer_never_mutates_any_earlier_state_or_action(acts: list[dict[str, Any]]) -> None:
    acts_before = copy.deepcopy(acts)
    states = _stepwise(acts)
    # Snapshot every state right after it was made, then check none changed later.
    snapshots = []
    s = initial_state()
    for a in acts:
        snapshots.append(copy.deepcopy(s.to_json()))
        s = session_reducer(s, a)
    snapshots.append(copy.deepcopy(s.to_json()))
    assert [x.to_json() for x in states] == snapshots
    assert acts == acts_before


@FAST
@given(action_lists, action_lists)
def test_fold_never_mutates_its_input_state_or_actions(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    start = fold(a)
    before = copy.deepcopy(start.to_json())
    b_before = copy.deepcopy(b)
    fold(b, start)
    fold_json(start.to_json(), b)
    assert start.to_json() == before
    assert b == b_before


@FAST
@given(action_lists, action_lists)
def test_fold_json_never_mutates_its_input_state(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    start = fold_json(None, a)
    before = copy.deepcopy(start)
    end = fold_json(start, b)
    assert start == before
    # And the result of one fold is not disturbed by folding on from it again.
    end_before = copy.deepcopy(end)
    fold_json(end, b)
    assert end == end_before


def _delta(mid: str, text: str, within: str | None = None) -> dict[str, Any]:
    action: dict[str, Any] = {"type": "part", "part": {"type": "text-delta", "messageId": mid, "text": text}}
    if within is not None:
        action["within"] = within
    return action


@FAST
@given(action_lists, action_lists, st.sampled_from([None, "c1"]))
def test_continuing_a_message_never_mutates_the_state_folded_from(
    a: list[dict[str, Any]], b: list[dict[str, Any]], within: str | None
) -> None:
    # The case the fold's in-place writes are most tempted by: the next event extends a
    # text part that the *previous* fold created.
    head = a + [
        {"type": "part", "part": {"type": "message-start", "messageId": "m1"}},
        {"type": "part", "part": {"type": "tool-call", "messageId": "m1", "id": "c1", "name": "search", "input": None}},
        {"type": "part", "part": {"type": "message-start", "messageId": "m1"}, "within": "c1"},
        _delta("m1", "x"),
        _delta("m1", "x", "c1"),
    ]
    tail = [_delta("m1", "y", within), _delta("m1", "z", within), *b]
    for make in (lambda: fold_json(None, head), lambda: fold(head).to_json()):
        start = make()
        before = copy.deepcopy(start)
        out = fold_json(start, tail)
        assert start == before
        assert out == fold(tail, start).to_json() == _stepwise(tail, SessionState.from_trusted(start))[-1].to_json()


@FAST
@given(action_lists)
def test_the_reducer_is_deterministic(acts: list[dict[str, Any]]) -> None:
    one, two = fold(acts), fold(copy.deepcopy(acts))
    assert one == two
    assert orjson.dumps(one.to_json()) == orjson.dumps(two.to_json())


@FAST
@given(action_lists, action_lists)
def test_fold_of_a_concatenation_is_fold_of_the_tail_over_fold_of_the_head(
    a: list[dict[str, Any]], b: list[dict[str, Any]]
) -> None:
    assert fold(a + b) == fold(b, fold(a))
    assert fold_json(None, a + b) == fold_json(fold_json(None, a), b)


@FAST
@given(action_lists)
def test_fold_equals_repeated_session_reducer(acts: list[dict[str, Any]]) -> None:
    stepwise = _stepwise(acts)[-1]
    assert fold(acts) == stepwise
    assert fold_json(None, acts) == stepwise.to_json()
    assert fold([parse_action(a) for a in acts]) == stepwise


@FAST
@given(action_lists)
def test_apply_action_returns_the_same_object_exactly_when_nothing_changed(acts: list[dict[str, Any]]) -> None:
    state = initial_state().to_json()
    for a in acts:
        before = copy.deepcopy(state)
        nxt = apply_action(state, a)
        if nxt is state:
            assert state == before
        state = nxt


@FAST
@given(action_lists)
def test_state_survives_a_json_round_trip(acts: list[dict[str, Any]]) -> None:
    s = fold(acts)
    assert SessionState.model_validate(s.to_json()) == s
    decoded = orjson.loads(orjson.dumps(s.to_json()))
    assert SessionState.model_validate(decoded) == s
    assert SessionState.model_validate_json(orjson.dumps(s.to_json())) == s


def _top_level_tools_after_last_user(messages: list[Any]) -> list[dict[str, Any]]:
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        return []
    return [p for m in messages[last_user + 1 :] for p in m["parts"] if p["type"] == "tool"]


@FAST
@given(action_lists)
def test_resumable_never_ends_in_an_unfinished_call(acts: list[dict[str, Any]]) -> None:
    s = fold(acts)
    before = copy.deepcopy(s.messages)
    out = resumable(s.messages)
    assert s.messages == before and out is not s.messages
    tools = _top_level_tools_after_last_user(out)
    # What Retry sends ends at a finished call (or at the user message): no running or
    # awaiting-confirmation call comes after the last finished one.
    if tools:
        assert tools[-1]["state"] in ("done", "error")
    # Everything it keeps is a prefix of the conversation.
    assert len(out) <= len(s.messages)
    assert out[:-1] == s.messages[: max(len(out) - 1, 0)]


@FAST
@given(action_lists)
def test_retry_leaves_no_open_call_after_the_last_finished_one(acts: list[dict[str, Any]]) -> None:
    s = session_reducer(fold(acts), {"type": "retry"})
    tools = _top_level_tools_after_last_user(s.messages)
    if tools:
        assert tools[-1]["state"] in ("done", "error")


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_random_sample_sessions_are_valid_and_fold_consistently(seed: int) -> None:
    acts = random_actions(random.Random(seed), 200)
    parsed = [parse_action(a) for a in acts]  # every sample action is well-formed
    assert [p.to_json() for p in parsed] == acts
    mid = 137
    assert fold(acts) == fold(acts[mid:], fold(acts[:mid])) == _stepwise(acts)[-1]


@FAST
@given(actions)
def test_every_generated_action_round_trips_through_its_model(action: dict[str, Any]) -> None:
    assert parse_action(action).to_json() == action
