"""The turn view: one row per turn of a session, for audit.

PURE: built from recorded events and the states they fold to; no storage or clock.
A *turn* is everything from one ``send`` up to the next (events carry their turn
number, the count of ``send`` events up to and including them). Events before the
first ``send`` form turn 0, shown only when there are any.

The view folds the events itself (one pass, each event folded once), so a turn's
final tool states, assistant text and outcome are read from the state at the turn's
last event — which is what a person auditing the conversation saw at that moment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from eventstore.core.reducer import fold_json
from eventstore.core.text import iso, shorten

__all__ = ["Turn", "ToolCall", "build_turns", "turn_messages"]

JSON = dict[str, Any]
Fold = Callable[[JSON | None, list[JSON]], JSON]


class _Event(Protocol):
    # The fields of RecordedEvent the view reads.
    @property
    def version(self) -> int: ...
    @property
    def type(self) -> str: ...
    @property
    def action(self) -> Mapping[str, Any]: ...
    @property
    def turn(self) -> int: ...
    @property
    def recorded_at(self) -> datetime: ...
    @property
    def actor(self) -> str | None: ...


@dataclass(frozen=True)
class ToolCall:
    """A tool call made during a turn, in its state at the end of the turn.

    Attributes:
        id: the call id.
        name: the tool name.
        state: ``running`` / ``awaiting-confirmation`` / ``done`` / ``error`` / ``cancelled``.
        depth: 0 for a call of the main run, 1+ for calls made by a sub-agent.
    """

    id: str
    name: str
    state: str
    depth: int = 0

    def to_json(self) -> JSON:
        return {"id": self.id, "name": self.name, "state": self.state, "depth": self.depth}


@dataclass(frozen=True)
class Turn:
    """One row of the turn view.

    Attributes:
        turn: the turn number (1 = the first ``send``; 0 = events before any send).
        first_version: version of the turn's first event.
        last_version: version of the turn's last event.
        events: number of events in the turn.
        actors: the distinct actors that recorded the turn's events, in order.
        started: ``recorded_at`` of the first event.
        ended: ``recorded_at`` of the last event.
        user_text: the text the user sent ("" for turn 0).
        assistant_text: the assistant's reply text at the end of the turn (whole, unless
            ``build_turns`` was given a ``text_limit``).
        tools: tool calls of the turn (nested ones with ``depth`` > 0), final states.
        outcome: ``idle``, ``error``, ``stopped`` or ``streaming`` (still running).
        error: the error message when the outcome is ``error``.
        retries: number of ``retry`` events in the turn.
        partial: True when the turn began before the session's compaction baseline.
    """

    turn: int
    first_version: int
    last_version: int
    events: int
    actors: tuple[str, ...]
    started: datetime
    ended: datetime
    user_text: str
    assistant_text: str
    tools: tuple[ToolCall, ...]
    outcome: str
    error: str | None
    retries: int
    partial: bool = False

    def to_json(self) -> JSON:
        return {
            "turn": self.turn,
            "versions": [self.first_version, self.last_version],
            "events": self.events,
            "actors": list(self.actors),
            "started": iso(self.started),
            "ended": iso(self.ended),
            "user_text": self.user_text,
            "assistant_text": self.assistant_text,
            "tools": [t.to_json() for t in self.tools],
            "outcome": self.outcome,
            "error": self.error,
            "retries": self.retries,
            "partial": self.partial,
        }


def _tools(messages: Sequence[Mapping[str, Any]], depth: int = 0) -> list[ToolCall]:
    out: list[ToolCall] = []
    for m in messages:
        for p in m.get("parts", []):
            if p.get("type") == "tool":
                out.append(ToolCall(str(p.get("id")), str(p.get("name")), str(p.get("state")), depth))
                agent = p.get("agent")
                if isinstance(agent, Mapping):
                    out.extend(_tools(agent.get("messages", []), depth + 1))
    return out


def turn_messages(state: Mapping[str, Any], user_id: str | None) -> list[Mapping[str, Any]]:
    """The messages of the turn started by user message ``user_id``: it and what follows.

    ``None`` stands for the events before any ``send`` (turn 0): the messages from the
    start up to the first user message. An id not in ``state`` gives ``[]``.
    """
    messages: Sequence[Mapping[str, Any]] = state.get("messages", [])
    start = 0
    if user_id is not None:
        for i in range(len(messages) - 1, -1, -1):
            m = messages[i]
            if m.get("role") == "user" and m.get("id") == user_id:
                start = i
                break
        else:
            return []
    out: list[Mapping[str, Any]] = []
    for i, m in enumerate(messages[start:]):
        if i > 0 and m.get("role") == "user":
            break
        out.append(m)
    return out


def _row(
    events: list[_Event],
    state: Mapping[str, Any],
    text_limit: int | None,
    partial: bool,
) -> Turn:
    send = next((e for e in events if e.type == "send"), None)
    user_id = str(send.action.get("id")) if send is not None else None
    user_text = str(send.action.get("text", "")) if send is not None else ""
    msgs = turn_messages(state, user_id)
    # Text parts split by a tool call are separate sentences: keep a space between them.
    reply = " ".join(
        str(p.get("text", ""))
        for m in msgs
        if m.get("role") == "assistant"
        for p in m.get("parts", [])
        if p.get("type") == "text"
    )
    status = str(state.get("status", "idle"))
    err = state.get("error")
    # "stopped" only when the turn's last run ended by a stop (a retry after it starts over).
    stopped = False
    for e in events:
        part = e.action.get("part", {}) if e.type == "part" and not e.action.get("within") else {}
        if e.type == "stop" or (part.get("type") == "finish" and part.get("reason") == "aborted"):
            stopped = True
        elif e.type in ("retry", "send") or part.get("type") in ("finish", "error"):
            stopped = False
    outcome = "stopped" if status == "idle" and stopped else status
    actors: list[str] = []
    for e in events:
        if e.actor and e.actor not in actors:
            actors.append(e.actor)
    return Turn(
        turn=events[0].turn,
        first_version=events[0].version,
        last_version=events[-1].version,
        events=len(events),
        actors=tuple(actors),
        started=events[0].recorded_at,
        ended=events[-1].recorded_at,
        user_text=user_text if text_limit is None else shorten(user_text, text_limit),
        assistant_text=reply if text_limit is None else shorten(reply, text_limit),
        tools=tuple(_tools(msgs)),
        outcome=outcome,
        error=str(err.get("message")) if status == "error" and isinstance(err, Mapping) else None,
        retries=sum(1 for e in events if e.type == "retry"),
        partial=partial,
    )


def build_turns(
    events: Iterable[_Event],
    start_state: Mapping[str, Any] | None = None,
    *,
    fold: Fold | None = None,
    text_limit: int | None = None,
) -> list[Turn]:
    """Group events into turns and describe each one.

    Args:
        events: the session's recorded events, oldest first (a branch's inherited
            prefix included), e.g. ``EventStore.history(session)``.
        start_state: the state before the first event — the initial state (``None``) or,
            for a compacted session, the baseline state.
        fold: ``fold(state_dict | None, [action, ...]) -> state_dict``; the reducer's
            ``fold_json`` by default.
        text_limit: shorten user and assistant texts to this many characters (``None``,
            the default: keep them whole, as machine output needs).

    Returns:
        One :class:`Turn` per turn present in ``events``, in order.
    """
    if fold is None:
        fold = fold_json
    state: JSON | None = dict(start_state) if start_state is not None else None
    rows: list[Turn] = []
    group: list[_Event] = []
    # The first group is partial when history starts mid-turn (after a compaction baseline).
    first_partial = start_state is not None

    def flush() -> None:
        nonlocal state, first_partial
        if not group:
            return
        state = fold(state, [dict(e.action) for e in group])
        partial = first_partial and group[0].type != "send"
        rows.append(_row(group, state, text_limit, partial))
        first_partial = False

    for e in events:
        if group and e.turn != group[-1].turn:
            flush()
            group = []
        group.append(e)
    flush()
    return rows
