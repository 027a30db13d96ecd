"""What the pages read of the catalogue and of kept lines, in one place.

The pages take a page of sessions and a session's kept lines from here, so that what a
listing shows (title, owner, last activity) is decided once for every page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventstore import EventStore, SessionInfo, SessionPage

__all__ = ["list_sessions", "lines", "title_of", "owner_of", "updated_of"]


def title_of(info: SessionInfo) -> str | None:
    """The session's title (set, or its first user text)."""
    return info.title


def owner_of(info: SessionInfo) -> str | None:
    """The session's owner, if set."""
    return info.owner


def updated_of(info: SessionInfo) -> Any:
    """When the session last changed."""
    return info.updated_at or info.created_at


def list_sessions(
    store: EventStore,
    *,
    owner: str | None,
    query: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
) -> SessionPage:
    """One page of sessions, newest activity first.

    Raises:
        InvalidEvent: a malformed cursor, status or limit.
    """
    return store.list_sessions(owner=owner, query=query, status=status, limit=limit, cursor=cursor)


def lines(store: EventStore, session: str) -> list[SessionInfo]:
    """The lines a rewind kept for ``session``, oldest first."""
    return store.lines(session)
