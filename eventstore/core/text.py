"""Short readable text for people: timestamps, cut-down strings, one-line message summaries.

PURE: used by the records, the diff and the turn view when they render themselves.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

__all__ = ["iso", "shorten", "compact_json", "message_text", "visible"]


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


# Anything but printable ASCII, tab and newline may be a character that changes how text reads.
_SUSPECT = re.compile("[^\t\n\x20-\x7e]")
# Controls, format characters (bidi overrides and isolates, zero-width marks), line and
# paragraph separators, lone surrogates.
_HIDDEN = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))


def _shown(m: re.Match[str]) -> str:
    c = m.group()
    if unicodedata.category(c) not in _HIDDEN:
        return c
    n = ord(c)
    return f"\\x{n:02x}" if n <= 0xFF else f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"


def visible(text: str) -> str:
    """``text`` with every invisible or control character shown as an escape (``\\u202e``).

    Newlines and tabs stay (message bodies keep their lines). A right-to-left override
    or a zero-width character stored in a log would otherwise reorder or hide the text
    around it on a page; spelled out, a reader sees it is there.
    """
    return text if _SUSPECT.search(text) is None else _SUSPECT.sub(_shown, text)
