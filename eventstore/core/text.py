"""Short readable text for people: timestamps, cut-down strings, one-line message summaries.

PURE: used by the records, the diff and the turn view when they render themselves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

__all__ = ["iso", "shorten", "compact_json", "message_text"]


def iso(when: datetime) -> str:
    """ISO 8601 in UTC with a ``Z`` suffix: how every timestamp is shown in JSON."""
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def shorten(text: Any, limit: int = 60) -> str:
    """Collapse whitespace and cut ``text`` to ``limit`` characters with an ellipsis."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def compact_json(value: Any, limit: int = 60) -> str:
    """A JSON value on one line, shortened (non-JSON values shown by ``str``)."""
    return shorten(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str), limit)


def message_text(message: Mapping[str, Any]) -> str:
    """A message in one line: its texts shortened, its tool calls as ``[name state]``."""
    bits = []
    for p in message.get("parts", []):
        if p.get("type") == "text":
            bits.append(shorten(p.get("text", ""), 50))
        elif p.get("type") == "tool":
            bits.append(f"[{p.get('name')} {p.get('state')}]")
    return " ".join(bits) or "(empty)"
