"""What the explorer reads beyond the store's long-standing methods: the catalogue and kept lines.

Each goes through one small function so the pages never care which store they run on:
a store with ``list_sessions`` / ``lines`` is asked directly; an older one is served by a
fallback over ``store.sessions()`` (titles, owners and kept lines simply absent), which
lists every session each time and is meant to go once every store has the catalogue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eventstore.errors import InvalidEvent

if TYPE_CHECKING:
    from eventstore import EventStore, SessionInfo

__all__ = ["Page", "list_sessions", "lines", "title_of", "owner_of", "updated_of"]

STATUSES = ("idle", "streaming", "error", "closed")


@dataclass(frozen=True)
class Page:
    """One page of the catalogue: ``items`` and the cursor of the next page (``None``: last)."""

    items: Sequence[SessionInfo]
    next_cursor: str | None


def title_of(info: SessionInfo) -> str | None:
    """The session's title, when the store keeps titles."""
    value = getattr(info, "title", None)
    return None if value is None else str(value)


def owner_of(info: SessionInfo) -> str | None:
    """The session's owner, when the store keeps owners."""
    value = getattr(info, "owner", None)
    return None if value is None else str(value)


def updated_of(info: SessionInfo) -> Any:
    """When the session last changed, when the store tells (else when it was created)."""
    return getattr(info, "updated_at", None) or info.created_at


def list_sessions(
    store: EventStore,
    *,
    owner: str | None,
    query: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
) -> Page:
    """One page of sessions, newest first: ``store.list_sessions`` when the store has it.

    Raises:
        InvalidEvent: a malformed cursor or status (as ``list_sessions`` itself does).
    """
    listing = getattr(store, "list_sessions", None)
    if listing is not None:
        page = listing(owner=owner, query=query, status=status, limit=limit, cursor=cursor)
        return Page(list(page.items), page.next_cursor)
    # The fallback: filter and page the whole list; the cursor is an offset.
    if status is not None and status not in STATUSES:
        raise InvalidEvent(f"status must be one of {', '.join(STATUSES)}, got {status!r}", field="status")
    try:
        start = int(cursor) if cursor else 0
    except ValueError:
        raise InvalidEvent(f"not a cursor of this listing: {cursor!r}", field="cursor") from None
    if start < 0:
        raise InvalidEvent(f"not a cursor of this listing: {cursor!r}", field="cursor")
    rows = sorted(store.sessions(), key=lambda s: (-updated_of(s).timestamp(), s.id))
    if owner is not None:
        rows = [s for s in rows if owner_of(s) == owner]
    if query:
        q = query.casefold()
        rows = [s for s in rows if q in (title_of(s) or s.id).casefold()]
    if status is not None:
        rows = [s for s in rows if _status(store, s) == status]
    items = rows[start : start + limit]
    more = start + limit < len(rows)
    return Page(items, str(start + limit) if more else None)


def _status(store: EventStore, info: SessionInfo) -> str:
    if info.closed:
        return "closed"
    return str(store.load(info.id).status)


def lines(store: EventStore, session: str) -> list[SessionInfo]:
    """The lines a rewind kept for ``session``, oldest first (``[]`` on a store without rewind)."""
    kept = getattr(store, "lines", None)
    return list(kept(session)) if kept is not None else []
