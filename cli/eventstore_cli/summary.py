"""One-line descriptions of stored values, already safe for a terminal (no Rich here).

Kept apart from :mod:`.render` so the plain, fast listings (``history``, ``replay``)
never load Rich.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from eventstore import one_line

from .terminal import safe

#: ``text`` on one line, terminal-safe, cut to ``limit`` characters with ``…`` (the
#: library's rule, :func:`eventstore.one_line`).
shorten = one_line

__all__ = ["short_time", "shorten", "compact_json", "action_summary", "fit", "quoted"]


def short_time(dt: datetime | None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` (UTC), or empty."""
    return "" if dt is None else dt.strftime("%Y-%m-%d %H:%M:%S")


def quoted(text: object, limit: int = 50) -> str:
    """``text`` as a shortened, quoted literal (``'…'``), terminal-safe."""
    return safe(repr(one_line(text, limit, escape=False)))


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with ``…`` (for a terminal line)."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def compact_json(value: Any, limit: int = 60) -> str:
    """``value`` as compact JSON on one line, terminal-safe, shortened."""
    return shorten(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str), limit)


def _part_summary(action: Mapping[str, Any]) -> str:
    part = action.get("part", {})
    pt = part.get("type")
    within = f" [within {action['within']}]" if action.get("within") else ""
    if pt in ("text-delta", "reasoning"):
        body = f"{part.get('messageId')} {quoted(part.get('text', ''), 50)}"
    elif pt == "message-start":
        body = str(part.get("messageId"))
    elif pt == "tool-call":
        body = f"{part.get('name')}({part.get('id')}) {compact_json(part.get('input'), 40)}"
    elif pt == "tool-result":
        body = f"{part.get('id')} → {compact_json(part.get('output'), 40)}"
    elif pt == "tool-error":
        body = f"{part.get('id')} ✗ {compact_json(part.get('error'), 40)}"
    elif pt == "finish":
        body = str(part.get("reason", ""))
    elif pt == "error":
        code = f" ({part['code']})" if part.get("code") else ""
        body = f"{part.get('error')}{code}"
    else:
        body = ""
    return f"{pt} {body}".rstrip() + within


def action_summary(action: Mapping[str, Any]) -> str:
    """A one-line, terminal-safe description of an action."""
    kind = action.get("type")
    if kind == "send":
        text = f"{action.get('id')}: {quoted(action.get('text', ''), 50)}"
    elif kind == "toolPhase":
        prompt = f" {quoted(action['prompt'], 40)}" if action.get("prompt") else ""
        text = f"{action.get('name')} → {action.get('state')}{prompt}"
    elif kind == "part":
        text = _part_summary(action)
    else:
        text = ""
    return safe(text)
