"""Sessions recorded for the audit report tests (store tests and the browser test).

Each ``record_*`` function appends one session to a migrated store and returns its id.
"""

from __future__ import annotations

from typing import Any

from eventstore import EventStore, samples
from eventstore.core.turn_rules import INTERRUPTED

# The first version of the demo's second turn (its second `send`).
DEMO_TURN2 = 1 + [i for i, a in enumerate(samples.demo_conversation()) if a["type"] == "send"][1]

HOSTILE_ID = 'x"><img src=x onerror="window.__pwned=1">'
HOSTILE_TEXT = "<script>alert(1)</script>"
HOSTILE_ACTOR = "<b onmouseover=window.__pwned=3>actor</b>"
HOSTILE_TOOL = "<img src=x onerror=window.__pwned=4>"
# Markup that would make a request or run code if it were ever interpreted.
HOSTILE_OUTPUT = (
    '</pre><script>document.title="pwned";window.__pwned=2</script>'
    '<img src="http://127.0.0.1:9/leak.png"><link rel="stylesheet" href="http://127.0.0.1:9/x.css">'
)


def _part(part: dict[str, Any], within: str | None = None) -> dict[str, Any]:
    action: dict[str, Any] = {"type": "part", "part": part}
    if within is not None:
        action["within"] = within
    return action


def record_demo(store: EventStore, session: str = "demo") -> str:
    """The sample shopping conversation, turn by turn as a user and a model record it."""
    actions = samples.demo_conversation()
    cut = DEMO_TURN2 - 1
    store.append(session, actions[:1], expected_version=0, actor="user:ada")
    store.append(session, actions[1:cut], expected_version=1, actor="model:demo")
    store.append(session, actions[cut : cut + 1], expected_version=cut, actor="user:ada")
    store.append(session, actions[cut + 1 :], expected_version=cut + 1, actor="model:demo")
    return session


def record_nested(store: EventStore, session: str = "nested") -> str:
    """A sub-agent that itself delegates to a sub-agent (two levels of nesting)."""
    actions = [
        {"type": "send", "id": "u-1", "text": "Plan a trip"},
        _part({"type": "message-start", "messageId": "a-1"}),
        _part({"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "planner", "input": {"days": 3}}),
        _part({"type": "message-start", "messageId": "p-1"}, "c-1"),
        _part({"type": "text-delta", "messageId": "p-1", "text": "Asking the hotel agent."}, "c-1"),
        _part({"type": "tool-call", "messageId": "p-1", "id": "c-2", "name": "hotel_agent", "input": {}}, "c-1"),
        _part({"type": "message-start", "messageId": "h-1"}, "c-2"),
        _part({"type": "tool-call", "messageId": "h-1", "id": "c-3", "name": "book_room", "input": {"n": 1}}, "c-2"),
        _part({"type": "tool-error", "id": "c-3", "error": {"message": "No rooms left"}}, "c-2"),
        _part({"type": "finish", "reason": "stop"}, "c-2"),
        _part({"type": "tool-result", "id": "c-2", "output": "no hotel"}, "c-1"),
        _part({"type": "finish", "reason": "stop"}, "c-1"),
        _part({"type": "tool-result", "id": "c-1", "output": {"plan": "stay with friends"}}),
        _part({"type": "text-delta", "messageId": "a-1", "text": "Stay with friends."}),
        _part({"type": "finish", "reason": "stop"}),
    ]
    store.append(session, actions, expected_version=0, actor="model:planner")
    return session


def record_interrupted(store: EventStore, session: str = "crashed") -> str:
    """A turn cut by a crash and closed by recovery, then a normal second turn."""
    head = store.append(
        session,
        [
            {"type": "send", "id": "u-1", "text": "Refund order 7"},
            _part({"type": "message-start", "messageId": "a-1"}),
            _part({"type": "text-delta", "messageId": "a-1", "text": "Looking up order 7"}),
            _part({"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "refund", "input": {"order": 7}}),
        ],
        expected_version=0,
        actor="model:demo",
    ).version
    head = store.append(
        session, [_part({"type": "error", "error": INTERRUPTED})], expected_version=head, actor="recovery"
    ).version
    store.append(
        session,
        [
            {"type": "send", "id": "u-2", "text": "Did it work?"},
            _part({"type": "message-start", "messageId": "a-2"}),
            _part({"type": "text-delta", "messageId": "a-2", "text": "No, please try again."}),
            {"type": "stop"},
        ],
        expected_version=head,
        actor="model:demo",
    )
    return session


def record_hostile(store: EventStore, session: str = HOSTILE_ID) -> str:
    """Markup and script everywhere the log holds text: ids, actor, texts, tool data."""
    actions = [
        {"type": "send", "id": "<u>", "text": HOSTILE_TEXT},
        _part({"type": "message-start", "messageId": "<a>"}),
        _part({"type": "reasoning", "messageId": "<a>", "text": "<iframe src=http://127.0.0.1:9/>"}),
        _part({"type": "text-delta", "messageId": "<a>", "text": "<style>body{display:none}</style>"}),
        _part(
            {
                "type": "tool-call",
                "messageId": "<a>",
                "id": "<c>",
                "name": HOSTILE_TOOL,
                "input": {"<k>": "<script>window.__pwned=5</script>"},
            }
        ),
        _part({"type": "tool-result", "id": "<c>", "output": HOSTILE_OUTPUT}),
        _part({"type": "error", "error": "<svg onload=window.__pwned=6>", "code": "network"}),
    ]
    store.append(session, actions, expected_version=0, actor=HOSTILE_ACTOR)
    return session
