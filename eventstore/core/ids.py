"""Rules for session ids that only apply when a session is created.

A reference to a session version is written ``SESSION@VERSION`` and splits at the last
``@`` only when a version number follows it, so ``ada@example.com`` is a plain session
id. A new id that itself ends in ``@`` and digits (``x@3``) could never be named on its
own, so it is refused when the session would be created (append, branch, import).
Sessions that already exist stay readable whatever their id.
"""

from __future__ import annotations

import re

from eventstore.errors import InvalidEvent

__all__ = ["check_new_session_id", "split_ref"]

_VERSION_SUFFIX = re.compile(r"@([0-9]+)\Z")
# ``SESSION~N``: the id a rewind gives the line it keeps (see eventstore.features.rewind).
_KEPT_SUFFIX = re.compile(r"~[0-9]+\Z")


def split_ref(ref: str) -> tuple[str, int | None]:
    """``"s@3"`` → ``("s", 3)``; ``"ada@example.com"`` → ``("ada@example.com", None)``.

    Only ASCII digits after the last ``@`` make a version.
    """
    m = _VERSION_SUFFIX.search(ref)
    if m is None:
        return ref, None
    return ref[: m.start()], int(m.group(1))


def check_new_session_id(session: str, what: str = "session") -> None:
    """Refuse a new session id that would read as ``SESSION@VERSION``.

    Also refuse an id ending in ``~`` and digits: that is how a rewind names the line it
    keeps, so such an id could clash with one.

    Raises:
        InvalidEvent: ``session`` ends in ``@`` or ``~`` followed by digits.
    """
    if _KEPT_SUFFIX.search(session):
        raise InvalidEvent(
            f"a new session id must not end in '~' and digits ({session!r} is how a rewind "
            "names the line it keeps)",
            field=what,
        )
    if _VERSION_SUFFIX.search(session):
        raise InvalidEvent(
            f"a new session id must not end in '@' and digits ({session!r} would read as "
            "SESSION@VERSION)",
            field=what,
        )
