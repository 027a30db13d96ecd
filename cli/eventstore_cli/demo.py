"""``eventstore demo``: record the sample conversation, fork it, and show the time travel."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.rule import Rule
from rich.text import Text

from eventstore import EventStore, SessionNotFound
from eventstore.samples import demo_conversation

from . import render

# The alternative second turn appended to the branch: the user changes their mind.
ALT_TURN: list[dict[str, Any]] = [
    {"type": "send", "id": "u-2", "text": "Actually, skip the gift card. Just check out the mugs."},
    {"type": "part", "part": {"type": "message-start", "messageId": "a-2"}},
    {"type": "part", "part": {"type": "text-delta", "messageId": "a-2", "text": "Sure, checking out"}},
    {"type": "part", "part": {"type": "text-delta", "messageId": "a-2", "text": " the two mugs."}},
    {
        "type": "part",
        "part": {
            "type": "tool-call",
            "messageId": "a-2",
            "id": "call-9",
            "name": "checkout",
            "input": {"items": ["stoneware-mug", "stoneware-mug"]},
        },
    },
    {"type": "part", "part": {"type": "tool-result", "id": "call-9", "output": {"order": "A-1043", "total": 28.0}}},
    {
        "type": "part",
        "part": {"type": "text-delta", "messageId": "a-2", "text": " Order A-1043 is placed: $28.00."},
    },
    {"type": "part", "part": {"type": "finish", "reason": "stop"}},
]

_USER_ACTIONS = {"send", "retry", "stop", "reset"}


def _free_id(store: EventStore, base: str) -> str:
    """``base``, or ``base-2``, ``base-3`` … — the first id with neither it nor its branch taken."""
    n = 1
    while True:
        candidate = base if n == 1 else f"{base}-{n}"
        if not _exists(store, candidate) and not _exists(store, candidate + "-alt"):
            return candidate
        n += 1


def _exists(store: EventStore, session: str) -> bool:
    try:
        store.head(session)
    except SessionNotFound:
        return False
    return True


def record(store: EventStore, session: str, actions: list[dict[str, Any]], *, start: int = 0) -> int:
    """Append ``actions`` in runs of one actor each ("user" or "assistant"); returns the head."""
    head = start
    run: list[dict[str, Any]] = []
    actor = None
    for a in actions + [{"type": "__end__"}]:
        who = "user" if a["type"] in _USER_ACTIONS else "assistant"
        if run and (who != actor or a["type"] == "__end__"):
            head = store.append(session, run, expected_version=head, actor=actor).version
            run = []
        actor = who
        if a["type"] != "__end__":
            run.append(a)
    return head


def run_demo(store: EventStore, out: Console) -> tuple[str, str]:
    """Run the demo on ``store``, printing to ``out``; returns (session, branch) ids."""
    store.migrate()
    session = _free_id(store, "demo")
    actions = demo_conversation()
    head = record(store, session, actions)
    # Fork right after turn 1 ends: the version of the last event before the second send.
    second_send = [i for i, a in enumerate(actions) if a["type"] == "send"][1]
    fork_at = second_send  # versions are 1-based: action i is version i + 1
    alt = store.branch(session, at=fork_at, new_id=f"{session}-alt")
    alt_head = record(store, alt, ALT_TURN, start=fork_at)

    out.print(Rule(Text(f"recorded {session}: {head} events; branched {alt} at {fork_at}")))
    out.print(render.turns_view(store.turns(session), session, width=out.width))
    out.print(Rule(Text(f"checkout {alt} (head {alt_head})")))
    out.print(render.state_panel(store.load(alt).to_json(), f"{alt}@{alt_head}"))
    out.print(Rule(Text(f"diff {session} {alt}")))
    out.print(render.diff_view(store.diff((session, None), (alt, None))))
    out.print(Rule(Text("try next")))
    for cmd in (
        f"eventstore history {session} --turns",
        f"eventstore checkout {session}@{fork_at}",
        f"eventstore replay {session} --from {fork_at} --to {fork_at + 6}",
        f"eventstore diff {session}@{fork_at} {alt}",
        "eventstore sessions",
        "eventstore verify",
    ):
        out.print(Text(f"  {cmd}", style="bold"))
    return session, alt
