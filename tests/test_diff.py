"""The pure diff: fork-point search over lineages and message-level state changes."""

from __future__ import annotations

from eventstore.core.diff import LineageSegment as Seg
from eventstore.core.diff import Ref, describe_message_change, diff_states, find_base


def test_base_of_same_session_is_the_older_version() -> None:
    a = [Seg("s", 0, 5)]
    b = [Seg("s", 0, 3)]
    assert find_base(a, b) == Ref("s", 3)
    assert find_base(b, a) == Ref("s", 3)


def test_base_of_a_branch_and_its_parent_is_the_fork_point() -> None:
    parent = [Seg("s", 0, 9)]
    child = [Seg("s", 0, 4), Seg("c", 4, 7)]
    assert find_base(parent, child) == Ref("s", 4)
    # The parent ref before the fork point: the base is the parent ref itself.
    assert find_base([Seg("s", 0, 2)], child) == Ref("s", 2)


def test_base_at_depth_three_is_the_deepest_shared_recording() -> None:
    # s ← a (at 3) ← b (at 5) ← c (at 8);  s ← a ← d (at 6)
    c = [Seg("s", 0, 3), Seg("a", 3, 5), Seg("b", 5, 8), Seg("c", 8, 12)]
    d = [Seg("s", 0, 3), Seg("a", 3, 6), Seg("d", 6, 9)]
    assert find_base(c, d) == Ref("a", 5)
    # Two grandchildren of b forked at different points share b up to the older fork.
    e = [Seg("s", 0, 3), Seg("a", 3, 5), Seg("b", 5, 7), Seg("e", 7, 10)]
    assert find_base(c, e) == Ref("b", 7)


def test_siblings_forked_at_the_same_version_share_the_parent_state() -> None:
    x = [Seg("s", 0, 4), Seg("x", 4, 6)]
    y = [Seg("s", 0, 4), Seg("y", 4, 5)]
    assert find_base(x, y) == Ref("s", 4)


def test_unrelated_sessions_share_nothing_and_a_branch_at_zero_shares_the_empty_state() -> None:
    assert find_base([Seg("s", 0, 3)], [Seg("t", 0, 3)]) is None
    assert find_base([Seg("s", 0, 3)], [Seg("s", 0, 0), Seg("z", 0, 2)]) == Ref("s", 0)


def _msg(mid: str, role: str, *parts: dict) -> dict:
    return {"id": mid, "role": role, "parts": list(parts)}


def test_diff_states_reports_added_removed_changed_in_order() -> None:
    left = {
        "messages": [
            _msg("u-1", "user", {"type": "text", "text": "hi"}),
            _msg("a-1", "assistant", {"type": "text", "text": "Hel"}),
            _msg("a-x", "assistant", {"type": "text", "text": "gone"}),
        ],
        "status": "streaming",
    }
    right = {
        "messages": [
            _msg("u-1", "user", {"type": "text", "text": "hi"}),
            _msg("a-1", "assistant", {"type": "text", "text": "Hello there"}),
            _msg("u-2", "user", {"type": "text", "text": "more"}),
        ],
        "status": "idle",
    }
    d = diff_states(left, right)
    assert d.added == ("u-2",)
    assert d.removed == ("a-x",)
    assert d.changed == ("a-1",)
    assert d.details[0].lines == ("text +'lo there'",)


def test_tool_state_changes_and_sub_agent_progress_are_described() -> None:
    call = {"type": "tool", "id": "c1", "name": "add_to_cart", "input": {}, "state": "running"}
    done = dict(call, state="done", output={"ok": True})
    lines = describe_message_change(_msg("a", "assistant", call), _msg("a", "assistant", done))
    assert lines[0] == "tool add_to_cart (c1): running → done"
    assert "output" in lines[1]
    nested = dict(
        call,
        agent={"messages": [_msg("g", "assistant", {"type": "text", "text": "x"})], "status": "idle"},
    )
    lines = describe_message_change(_msg("a", "assistant", call), _msg("a", "assistant", nested))
    assert any("sub-agent" in line and "+1 msgs" in line for line in lines)
    lines = describe_message_change(
        _msg("a", "assistant", call), _msg("a", "assistant", call, {"type": "text", "text": "ok"})
    )
    assert lines == ["+ text 'ok'"]


def test_repeated_message_ids_are_kept_apart() -> None:
    m = _msg("a", "assistant", {"type": "text", "text": "x"})
    d = diff_states({"messages": [m]}, {"messages": [m, m]})
    assert d.added == ("a#2",) and not d.changed


def test_session_diff_describe_is_readable() -> None:
    from eventstore.core.diff import SessionDiff

    left = {"messages": [_msg("u-1", "user", {"type": "text", "text": "hi"}),
                         _msg("a-1", "assistant", {"type": "text", "text": "Hel"})], "status": "streaming"}
    right = {"messages": [_msg("u-1", "user", {"type": "text", "text": "hi"}),
                          _msg("a-1", "assistant", {"type": "text", "text": "Hello"}),
                          _msg("u-2", "user", {"type": "text", "text": "more"})], "status": "idle"}
    sd = diff_states(left, right)
    d = SessionDiff(Ref("s", 5), Ref("t", 7), Ref("s", 3), sd.added, sd.removed, sd.changed,
                    "streaming", "idle", 2, 4, sd.details, sd.left_messages, sd.right_messages)
    text = str(d)
    assert text.splitlines()[0] == "s@5 → t@7 (base s@3; 2 event(s) on the left, 4 on the right since)"
    assert "+ user u-2: 'more'" in text or "+ user u-2: more" in text
    assert "    text +'lo'" in text and "status streaming → idle" in text
    assert d.to_json()["events"] == {"left": 2, "right": 4}
