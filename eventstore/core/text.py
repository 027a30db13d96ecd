"""Short readable text for people, and the one rule for showing stored text literally.

Timestamps, cut-down strings, one-line message summaries, and :func:`visible`.

PURE: used by the records, the diff and the turn view when they render themselves, by the
audit report, and by the CLI (through the public ``eventstore.visible``).

Stored text is whatever a model or a user wrote. Characters that a terminal would act on,
or that change how text reads, are shown as visible escapes such as ``\\x1b`` or
``\\u202e``: C0 and C1 controls (ESC sequences, NUL, BEL, DEL, CR), bidirectional
overrides and isolates (``Please \\u202eapprove`` cannot render reversed), zero-width and
other invisible format characters, Unicode tag characters, line and paragraph separators
and lone surrogates. Backslashes are left alone, so a message that contains the four
characters ``\\x1b`` reads the same as one that contained an ESC: either way nothing
acted on the reader.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

__all__ = [
    "iso",
    "shorten",
    "one_line",
    "compact_json",
    "message_text",
    "UNSAFE",
    "visible",
    "visible_json",
]

# Every code point of the categories Cc (controls), Cf (format), Zl, Zp and Cs
# (surrogates), as of Unicode 15; tests/test_cli_terminal.py checks this list against
# unicodedata so it cannot fall behind silently.
_OTHER_UNSAFE = (
    "\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    "\ud800-\udfff"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)

#: Characters never shown raw (to a terminal, or on the report's page).
UNSAFE = re.compile(f"[\x00-\x1f{_OTHER_UNSAFE}]")
#: The same, but newlines and tabs pass (for multi-line message bodies).
_UNSAFE_INLINE = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHER_UNSAFE}]")
#: What json.dumps leaves raw (it escapes C0 controls itself; indentation uses \n).
_JSON_UNSAFE = re.compile(f"[{_OTHER_UNSAFE}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    if n <= 0xFF:
        return f"\\x{n:02x}"
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


def visible(text: object, *, multiline: bool = False) -> str:
    """``text`` as a string with every unsafe character (:data:`UNSAFE`) shown as a visible
    escape, so stored text is shown literally, never interpreted or reordered.

    Args:
        text: any value; non-strings are converted with ``str``.
        multiline: keep newlines and tabs (for message bodies); otherwise they are
            escaped too, so one stored value always shows on one line.
    """
    s = text if isinstance(text, str) else str(text)
    pattern = _UNSAFE_INLINE if multiline else UNSAFE
    if pattern.search(s) is None:
        return s
    return pattern.sub(_escape, s)


def _json_escape(m: re.Match[str]) -> str:
    n = ord(m.group())
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    n -= 0x10000
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def visible_json(text: str) -> str:
    """JSON text (as ``json.dumps(..., ensure_ascii=False)`` writes it) with the unsafe
    characters its strings hold spelled as JSON ``\\u`` escapes: the document decodes to
    the identical values (outside strings JSON has no such characters)."""
    return _JSON_UNSAFE.sub(_json_escape, text)


def iso(when: datetime) -> str:
    """ISO 8601 in UTC with a ``Z`` suffix: how every timestamp is shown in JSON."""
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shorten(text: Any, limit: int = 60) -> str:
    """Collapse whitespace and cut ``text`` to ``limit`` characters with an ellipsis."""
    return _cut(" ".join(str(text).split()), limit)


#: What :func:`one_line` folds into one space; every other control stays for :func:`visible`.
_BLANKS = re.compile(r"[ \t\n]+")


def one_line(text: object, limit: int = 60, *, escape: bool = True) -> str:
    """``text`` on one line for a terminal: runs of spaces, tabs and newlines folded into one
    space, every other unsafe character a visible escape (:func:`visible`), cut to ``limit``
    characters with an ellipsis.

    Args:
        text: any value; non-strings are converted with ``str``.
        limit: the most characters returned, the ellipsis included.
        escape: ``False`` leaves the unsafe characters as they are, for a caller that
            quotes the result with ``repr`` (which spells them itself).
    """
    flat = _BLANKS.sub(" ", str(text)).strip(" ")
    return _cut(visible(flat) if escape else flat, limit)


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
