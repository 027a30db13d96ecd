"""State-to-state diff and the fork-point search behind ``EventStore.diff``.

PURE: this module imports no storage, clock or I/O. It works on JSON-shaped states
(the wire shape in docs/format.md, what ``SessionState.to_json()`` returns) and on session lineages described
as plain tuples, so it can be tested without a database.

Two pieces:

* :func:`find_base` — the newest state two refs share. A ref ``(session, version)``
  stands for a chain of events ``1..version``, each recorded by one session of the
  ref's lineage (the session itself, its parent, its grandparent …). Two refs share
  the state at version ``k`` exactly when the same session recorded event ``k`` in
  both chains, so the base is the largest such ``k``.
* :func:`diff_states` — message-level changes between two states (added / removed /
  changed ids) with a readable description of what changed inside a changed message
  (appended text, tool state changes, sub-agent progress).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eventstore.core.text import compact_json, message_text, shorten

__all__ = [
    "Ref",
    "LineageSegment",
    "MessageChange",
    "SessionDiff",
    "find_base",
    "diff_states",
    "describe_message_change",
]

JSON = dict[str, Any]


@dataclass(frozen=True)
class Ref:
    """A point in a session's history: the state after event ``version`` of ``session``."""

    session: str
    version: int

    def to_json(self) -> JSON:
        return {"session": self.session, "version": self.version}

    def __str__(self) -> str:
        return f"{self.session}@{self.version}"


@dataclass(frozen=True)
class LineageSegment:
    """Versions ``start+1 .. end`` of a chain, all recorded by ``session``.

    A lineage is a list of segments ordered from the root session to the ref's own
    session; ``start`` of each segment is the fork version of the next-deeper
    session (0 for the root).
    """

    session: str
    start: int
    end: int


def find_base(left: Sequence[LineageSegment], right: Sequence[LineageSegment]) -> Ref | None:
    """The newest state two lineages share, or ``None`` when they share none.

    Args:
        left: lineage of the left ref, root first, each segment capped at the ref's version.
        right: lineage of the right ref, same form.

    Returns:
        ``Ref(recording_session, k)`` for the largest ``k`` such that the same session
        recorded event ``k`` in both chains (``k`` may be 0 when both chains start at the
        same root but differ from its first event), or ``None`` when the roots differ.
    """
    if not left or not right or left[0].session != right[0].session:
        return None
    base = Ref(left[0].session, 0)
    for a, b in zip(left, right):
        if a.session != b.session:
            break
        # Same session, hence the same fork point: the chains agree through the shorter end.
        end = min(a.end, b.end)
        if end > a.start:
            base = Ref(a.session, end)
        if a.end != b.end:
            break
    return base


@dataclass(frozen=True)
class MessageChange:
    """What changed inside one message that exists on both sides.

    Attributes:
        id: the message id.
        role: ``"user"`` or ``"assistant"``.
        lines: readable one-line descriptions, e.g. ``"text +'…'"`` or
            ``"tool add_to_cart (call-1): running → done"``.
    """

    id: str
    role: str
    lines: tuple[str, ...]

    def to_json(self) -> JSON:
        return {"id": self.id, "role": self.role, "changes": list(self.lines)}


@dataclass(frozen=True)
class SessionDiff:
    """The difference between two refs, as returned by ``EventStore.diff``.

    Attributes:
        left: the left ref, version resolved (never ``None``).
        right: the right ref, version resolved.
        base: the newest state both sides share (the fork point), or ``None``.
        added: ids of messages only on the right.
        removed: ids of messages only on the left.
        changed: ids of messages on both sides whose content differs.
        status_left: ``status`` of the left state.
        status_right: ``status`` of the right state.
        events_left: number of events on the left since the base (``left.version`` when no base).
        events_right: number of events on the right since the base.
        details: per changed message, what changed inside it.
        left_events: with ``diff(..., events=True)``, the left side's events since the base
            (``RecordedEvent`` objects, oldest first); ``None`` otherwise.
        right_events: the same for the right side.
        left_messages: the left state's messages by id (for rendering removed messages).
        right_messages: the right state's messages by id (for rendering added messages).
        error_left: the left state's ``error`` object, if any.
        error_right: the right state's ``error`` object, if any.
    """

    left: Ref
    right: Ref
    base: Ref | None
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    status_left: str
    status_right: str
    events_left: int
    events_right: int
    details: tuple[MessageChange, ...] = ()
    left_messages: Mapping[str, JSON] = field(default_factory=dict, repr=False, compare=False)
    right_messages: Mapping[str, JSON] = field(default_factory=dict, repr=False, compare=False)
    error_left: JSON | None = None
    error_right: JSON | None = None
    left_events: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)
    right_events: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)

    @property
    def identical(self) -> bool:
        """True when both states have the same messages and status."""
        return (
            not self.added
            and not self.removed
            and not self.changed
            and self.status_left == self.status_right
            and self.error_left == self.error_right
        )

    def summary(self, message_id: str) -> str:
        """A removed or added message in one line: ``role id: text [tool state]``."""
        m = self.right_messages.get(message_id) or self.left_messages.get(message_id) or {}
        return f"{m.get('role', '?')} {message_id}: {message_text(m)}"

    def describe(self) -> str:
        """A readable, uncoloured rendering: base, then one line per message change.

        Example::

            s1@5 → s1-alt@4 (base s1@3; 2 event(s) on the left, 1 on the right since)
            - assistant a-2: [checkout done] Your order is placed.
            + user u-3: What about tea cups?
            ~ assistant a-1
                text +' Done.'
                tool add_to_cart (call-1): running → done
            status idle → streaming
        """
        base = f"base {self.base}" if self.base else "no shared history"
        out = [
            f"{self.left} → {self.right} ({base}; {self.events_left} event(s) on the left, "
            f"{self.events_right} on the right since)"
        ]
        out += [f"- {self.summary(k)}" for k in self.removed]
        out += [f"+ {self.summary(k)}" for k in self.added]
        for d in self.details:
            out.append(f"~ {d.role} {d.id}")
            out.extend(f"    {line}" for line in d.lines)
        if self.status_left != self.status_right:
            out.append(f"status {self.status_left} → {self.status_right}")
        if self.identical:
            out.append("no differences")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.describe()

    def to_json(self) -> JSON:
        """Refs, base, message ids and statuses, event counts and, per changed message,
        both versions of it whole."""
        return {
            "left": self.left.to_json(),
            "right": self.right.to_json(),
            "base": self.base.to_json() if self.base else None,
            "messages": {
                "added": list(self.added),
                "removed": list(self.removed),
                "changed": list(self.changed),
            },
            "status": {"left": self.status_left, "right": self.status_right},
            "events": {"left": self.events_left, "right": self.events_right},
            # Whole messages, not the shortened lines of describe(): JSON is for programs.
            "details": [
                {
                    "id": d.id,
                    "role": d.role,
                    "left": self.left_messages.get(d.id),
                    "right": self.right_messages.get(d.id),
                }
                for d in self.details
            ],
            **(
                {
                    "events_since_base": {
                        "left": [e.to_json() for e in self.left_events],
                        "right": [e.to_json() for e in self.right_events or ()],
                    }
                }
                if self.left_events is not None
                else {}
            ),
        }


@dataclass(frozen=True)
class StateDiff:
    """The message-level part of a diff (no refs): what :func:`diff_states` returns."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    details: tuple[MessageChange, ...]
    left_messages: dict[str, JSON]
    right_messages: dict[str, JSON]


def _keyed(messages: Sequence[JSON]) -> dict[str, JSON]:
    # A message id can recur (a retried turn may reuse an assistant id); keep every
    # occurrence distinct so a re-added message is not mistaken for the old one.
    out: dict[str, JSON] = {}
    for m in messages:
        key = str(m.get("id"))
        n = 1
        while key in out:
            n += 1
            key = f"{m.get('id')}#{n}"
        out[key] = m
    return out


def diff_states(left: Mapping[str, Any], right: Mapping[str, Any]) -> StateDiff:
    """Message-level changes from ``left`` to ``right`` (JSON-shaped states).

    Args:
        left: a state as ``SessionState.to_json()`` gives it.
        right: the other state.

    Returns:
        A :class:`StateDiff`; ids keep the order in which they appear in their state.
    """
    lm = _keyed(left.get("messages", []))
    rm = _keyed(right.get("messages", []))
    added = tuple(k for k in rm if k not in lm)
    removed = tuple(k for k in lm if k not in rm)
    changed: list[str] = []
    details: list[MessageChange] = []
    for k, m in rm.items():
        old = lm.get(k)
        if old is not None and old != m:
            changed.append(k)
            details.append(
                MessageChange(k, str(m.get("role", "?")), tuple(describe_message_change(old, m)))
            )
    return StateDiff(added, removed, tuple(changed), tuple(details), lm, rm)


def describe_part(part: Mapping[str, Any]) -> str:
    """One readable line for a message part (used for added/removed parts)."""
    kind = part.get("type")
    if kind == "text":
        return f"text {shorten(str(part.get('text', '')))!r}"
    if kind == "reasoning":
        return f"reasoning {shorten(str(part.get('text', '')))!r}"
    if kind == "tool":
        extra = ""
        agent = part.get("agent")
        if isinstance(agent, Mapping):
            extra = f", sub-agent {agent.get('status')} ({len(agent.get('messages', []))} msgs)"
        return f"tool {part.get('name')} ({part.get('id')}) [{part.get('state')}{extra}]"
    return f"{kind} part"


def _describe_tool(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    label = f"tool {new.get('name')} ({new.get('id')})"
    lines: list[str] = []
    if old.get("state") != new.get("state"):
        lines.append(f"{label}: {old.get('state')} → {new.get('state')}")
    if old.get("output") != new.get("output") and "output" in new:
        lines.append(f"{label}: output {compact_json(new['output'])}")
    if old.get("error") != new.get("error") and "error" in new:
        lines.append(f"{label}: error {compact_json(new['error'])}")
    if old.get("prompt") != new.get("prompt"):
        lines.append(f"{label}: prompt {new.get('prompt')!r}")
    oa, na = old.get("agent"), new.get("agent")
    if oa != na and isinstance(na, Mapping):
        oa = oa if isinstance(oa, Mapping) else {"messages": [], "status": None}
        sub = diff_states(oa, na)
        bits = []
        if oa.get("status") != na.get("status"):
            bits.append(f"{oa.get('status')} → {na.get('status')}")
        if sub.added:
            bits.append(f"+{len(sub.added)} msgs")
        if sub.removed:
            bits.append(f"-{len(sub.removed)} msgs")
        if sub.changed:
            bits.append(f"~{len(sub.changed)} msgs")
        lines.append(f"{label}: sub-agent " + (", ".join(bits) or "changed"))
        for d in sub.details:
            lines.extend(f"  {d.id}: {line}" for line in d.lines)
    if not lines and old != new:
        lines.append(f"{label}: changed")
    return lines


def describe_message_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Readable lines saying what changed from ``old`` to ``new`` (same message id).

    Parts are compared by position: a text part that grew is reported as appended text,
    a tool part as its state transitions, extra parts as ``+ …`` and missing ones as ``- …``.
    """
    op: Sequence[Mapping[str, Any]] = old.get("parts", [])
    np_: Sequence[Mapping[str, Any]] = new.get("parts", [])
    lines: list[str] = []
    for i in range(max(len(op), len(np_))):
        a = op[i] if i < len(op) else None
        b = np_[i] if i < len(np_) else None
        if a == b:
            continue
        if a is None and b is not None:
            lines.append("+ " + describe_part(b))
        elif b is None and a is not None:
            lines.append("- " + describe_part(a))
        elif a is not None and b is not None:
            if a.get("type") != b.get("type") or (
                a.get("type") == "tool" and a.get("id") != b.get("id")
            ):
                lines.append("- " + describe_part(a))
                lines.append("+ " + describe_part(b))
            elif b.get("type") in ("text", "reasoning"):
                at, bt = str(a.get("text", "")), str(b.get("text", ""))
                if bt.startswith(at):
                    lines.append(f"{b.get('type')} +{shorten(bt[len(at):])!r}")
                else:
                    lines.append(f"{b.get('type')} {shorten(at)!r} → {shorten(bt)!r}")
            elif b.get("type") == "tool":
                lines.extend(_describe_tool(a, b))
            else:
                lines.append(f"~ {describe_part(b)}")
    if old.get("role") != new.get("role"):
        lines.append(f"role {old.get('role')} → {new.get('role')}")
    return lines or ["changed"]
