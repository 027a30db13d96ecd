"""The pure turn view over recorded events."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from eventstore.core.reducer import fold_json
from eventstore.samples import demo_conversation
from eventstore.core.turn_view import build_turns

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass
class Ev:
    version: int
    type: str
    action: dict[str, Any]
    turn: int
    recorded_at: datetime
    actor: str | None = None
    session_id: str = "s"
    metadata: dict[str, Any] = field(default_factory=dict)


def events(actions: list[dict[str, Any]]) -> list[Ev]:
    out, turn = [], 0
    for i, a in enumerate(actions, 1):
        turn += a["type"] == "send"
        who = "user" if a["type"] in ("send", "retry", "stop") else "assistant"
        out.append(Ev(i, a["type"], a, turn, T0 + timedelta(seconds=i), who))
    return out


def test_demo_conversation_turns() -> None:
    rows = build_turns(events(demo_conversation()))
    assert [r.turn for r in rows] == [1, 2]
    one, two = rows
    assert one.user_text.startswith("I need two coffee mugs")
    assert "Stoneware Mug" in one.assistant_text
    assert [(t.name, t.state) for t in one.tools] == [("search_products", "done"), ("add_to_cart", "done")]
    assert one.outcome == "idle" and one.retries == 0 and one.error is None
    assert one.actors == ("user", "assistant")
    assert two.retries == 1 and two.outcome == "idle"
    # After the retry the failed checkout call is gone; the nested sub-agent call is listed at depth 1.
    assert ("list_gift_cards", "done", 1) in [(t.name, t.state, t.depth) for t in two.tools]
    assert ("checkout", "done", 0) in [(t.name, t.state, t.depth) for t in two.tools]
    assert two.first_version == one.last_version + 1
    assert two.started < two.ended
    assert one.to_json()["started"].endswith("Z")


def test_error_and_stopped_outcomes_and_turn_zero() -> None:
    acts = [
        {"type": "part", "part": {"type": "message-start", "messageId": "a-0"}},
        {"type": "send", "id": "u-1", "text": "hello"},
        {"type": "part", "part": {"type": "error", "error": "boom", "code": "network"}},
        {"type": "send", "id": "u-2", "text": "again"},
        {"type": "stop"},
    ]
    rows = build_turns(events(acts), fold=fold_json)
    assert [(r.turn, r.outcome) for r in rows] == [(0, "idle"), (1, "error"), (2, "stopped")]
    assert rows[1].error == "boom"


def test_history_starting_at_a_baseline_marks_the_first_turn_partial() -> None:
    acts = demo_conversation()
    evs = events(acts)
    cut = 5
    start = fold_json(None, acts[:cut])
    rows = build_turns(evs[cut:], start)
    full = build_turns(evs)
    assert rows[0].partial and not rows[1].partial
    assert rows[0].tools == full[0].tools and rows[1] == full[1]


def test_a_retry_after_a_stop_is_not_stopped() -> None:
    acts = [
        {"type": "send", "id": "u-1", "text": "hello"},
        {"type": "stop"},
        {"type": "retry"},
        {"type": "part", "part": {"type": "message-start", "messageId": "a-1"}},
        {"type": "part", "part": {"type": "finish", "reason": "stop"}},
        {"type": "send", "id": "u-2", "text": "again"},
        {"type": "part", "part": {"type": "finish", "reason": "aborted"}},
    ]
    rows = build_turns(events(acts))
    assert [(r.outcome, r.retries) for r in rows] == [("idle", 1), ("stopped", 0)]
