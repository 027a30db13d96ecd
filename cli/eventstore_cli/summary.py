"""One-line descriptions of stored values, already safe for a terminal (no Rich here).

Kept apart from :mod:`.render` so the plain, fast listings (``history``, ``replay``)
never load Rich.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .terminal import safe

_BLANKS = re.compile(r"[ \t\n]+")

__all__ = ["iso", "short_time", "shorten", "compact_json", "action_summary", "fit", "quoted"]


def iso(dt: datetime | None) -> str | None:
    """ISO 8601 in UTC with a ``Z`` suffix, as the JSON output uses."""
    if dt is None:
        return None
    return dt.isoformat().replace("+00:00", "Z")


def short_time(dt: datetime | None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` (UTC), or empty."""
    return "" if dt is None else dt.strftime("%Y-%m-%d %H:%M:%S")


def _one_line(text: object) -> str:
    # Only plain spaces, tabs and newlines fold into one space; every other control
    # character is left for safe() to show.
    return _BLANKS.sub(" ", str(text)).strip(" ")


def shorten(text: object, limit: int = 60) -> str:
    """``text`` on one line, terminal-safe, cut to ``limit`` characters with ``…``."""
    s = safe(_one_line(text))
    return s if len(s) <= limit else s[: limit - 1] + "…"


def quoted(text: object, limit: int = 50) -> str:
    """``text`` as a shortened, quoted literal (``'…'``), terminal-safe."""
    s = _one_line(text)
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return safe(repr(s))


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with ``…`` (for a terminal line)."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def compact_json(value: Any, limit: int = 60) -> str:
    """``value`` as compact JSON on one line, shortened."""
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
