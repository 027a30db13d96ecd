"""The conversations catalogue's pure rules: catalogue columns, argument checks, cursors.

What a batch does to a session's catalogue columns, the checks of ``set_info`` /
``list_sessions`` arguments, and the page cursor.

A sidebar lists sessions by owner, metadata, title, status and time; so that one page is
one index scan, the sessions row carries the fold's ``status``, the state's first user
text and the newest event's time, kept by every write that moves a head. A write does not
fold the session to learn them (an append costs O(1), not O(session)): it sends a
:class:`~eventstore.core.rows.CatalogueEffect` that the head-moving statement applies to
the old column values. Only ``retry`` depends on the state before it (it does nothing
without a user message), and ``first_text IS NOT NULL`` says exactly whether there is one:
``send`` adds a user message, ``reset`` removes them all, ``retry`` keeps the first.

No storage, clock or I/O here.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from eventstore.core.codec import canonical
from eventstore.core.models import check_json
from eventstore.core.records import InfoChange, RecordedEvent, SessionInfo, to_datetime
from eventstore.core.rows import NO_EFFECT, CatalogueEffect, CatalogueRow, RewindRow
from eventstore.core.text import iso
from eventstore.core.validation import CONTROL, check_text
from eventstore.errors import InvalidEvent

__all__ = [
    "TITLE_CHARS",
    "MAX_TITLE_CHARS",
    "MAX_METADATA_KEYS",
    "MAX_METADATA_BYTES",
    "STATUSES",
    "ORDERS",
    "MAX_LIMIT",
    "SessionPage",
    "Listing",
    "InfoChange",
    "name_info_changes",
    "info_record_of",
    "info_drift",
    "interleave_info",
    "effect",
    "absolute_effect",
    "apply_effect",
    "state_catalogue",
    "first_user_text",
    "rest_status",
    "catalogue_after",
    "catalogue_fields",
    "check_title",
    "check_metadata",
    "check_listing",
    "encode_cursor",
    "decode_cursor",
    "NO_EFFECT",
]

#: The automatic title: the first user text cut to this many characters.
TITLE_CHARS = 80
#: The longest title ``set_info`` accepts.
MAX_TITLE_CHARS = 200
#: The most keys, and the largest encoding, of a session's info metadata.
MAX_METADATA_KEYS = 64
MAX_METADATA_BYTES = 8192
_MAX_KEY_CHARS = 128
_MAX_QUERY_CHARS = 200
#: The statuses ``list_sessions`` filters on: the fold's, or closed to writes.
STATUSES = ("idle", "streaming", "error", "closed")
ORDERS = ("recent", "created")
MAX_LIMIT = 1000


# -- the effect of a batch ------------------------------------------------------------------


def _status_after(actions: Sequence[Mapping[str, Any]], user: bool) -> str | None:
    """The top-level status after ``actions`` from a state that holds a user message
    (``user``) or not; ``None`` when they leave it as it was (the reducer's rules)."""
    status: str | None = None
    for a in actions:
        kind = a.get("type")
        if kind == "send":
            status, user = "streaming", True
        elif kind == "part":
            if a.get("within") is None:
                part = a.get("part")
                part_type = part.get("type") if isinstance(part, Mapping) else None
                if part_type == "finish":
                    status = "idle"
                elif part_type == "error":
                    status = "error"
        elif kind == "stop":
            status = "idle"
        elif kind == "retry":
            if user:
                status = "streaming"
        elif kind == "reset":
            status, user = "idle", False
    return status


def _title_text(text: Any) -> str:
    """A user text as the automatic title: cut, and NUL (which a text column refuses)
    shown as U+FFFD."""
    return str(text)[:TITLE_CHARS].replace("\x00", "\ufffd")


def effect(actions: Sequence[Mapping[str, Any]], recorded_at: int) -> CatalogueEffect:
    """What a batch of validated action dicts, recorded at ``recorded_at``, does to the
    catalogue columns of its session (see :class:`~eventstore.core.rows.CatalogueEffect`)."""
    reset = False
    text: str | None = None
    for a in actions:
        kind = a.get("type")
        if kind == "reset":
            reset, text = True, None
        elif kind == "send" and text is None:
            text = _title_text(a.get("text", ""))
    return CatalogueEffect(
        recorded_at, _status_after(actions, True), _status_after(actions, False), reset, text
    )


def absolute_effect(status: str, first_text: str | None, updated_at: int) -> CatalogueEffect:
    """An effect that sets the columns to these values whatever they were (for a write
    that knows the state at the new head: an import, a branch, a rewind)."""
    return CatalogueEffect(updated_at, status, status, True, first_text)


def apply_effect(
    e: CatalogueEffect, status: str, first_text: str | None, updated_at: int
) -> tuple[str, str | None, int]:
    """The columns ``(status, first_text, updated_at)`` after ``e`` — what the SQL of
    every head-moving statement computes (kept here for the migration and the tests)."""
    new_status = e.status_with_user if first_text is not None else e.status_without_user
    return (
        status if new_status is None else new_status,
        e.first_text if e.reset else (first_text if first_text is not None else e.first_text),
        updated_at if e.updated_at is None else e.updated_at,
    )


def first_user_text(messages: Iterable[Mapping[str, Any]]) -> str | None:
    """The first user message's first text, cut (``""`` for a user message without
    text), or ``None`` when there is no user message. Reads only up to that message."""
    for m in messages:
        if m.get("role") == "user":
            texts = [p.get("text", "") for p in m.get("parts", ()) if p.get("type") == "text"]
            return _title_text(texts[0] if texts else "")
    return None


def rest_status(rest: Mapping[str, Any]) -> str:
    """The top-level status of a state dict, or of a snapshot's ``rest`` (the state
    without its messages)."""
    return str(rest.get("status", "idle"))


def state_catalogue(state: Mapping[str, Any]) -> tuple[str, str | None]:
    """``(status, first user text cut)`` of a state dict."""
    return rest_status(state), first_user_text(state.get("messages", ()))


def catalogue_after(
    status: str, first_text: str | None, actions: Sequence[Mapping[str, Any]]
) -> tuple[str, str | None]:
    """``(status, first_text)`` after ``actions`` from a state whose columns were these:
    the write path's rule (:func:`effect`, :func:`apply_effect`) run over events already
    stored, so that a version's columns cost the events after the nearest snapshot, not a
    fold of the whole state."""
    new_status, new_text, _ = apply_effect(effect(actions, 0), status, first_text, 0)
    return new_status, new_text


def catalogue_fields(row: CatalogueRow | None) -> dict[str, Any]:
    """The catalogue's :class:`~eventstore.core.records.SessionInfo` fields of a row."""
    if row is None:
        return {}
    return {
        "title": row.first_text if row.title is None else row.title,
        "owner": row.owner,
        "metadata": {} if row.metadata is None else orjson.loads(row.metadata),
        "updated_at": to_datetime(row.updated_at),
        "turns": row.head_turn,
        "status": row.status,
    }


# -- argument checks ------------------------------------------------------------------------


def _text(value: Any, what: str, limit: int, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise InvalidEvent(f"{what} must be a string, got {value!r}", field=what)
    if len(value) > limit:
        raise InvalidEvent(f"{what} is {len(value)} characters long, more than {limit}", field=what)
    check_text(value, what)
    return value


def check_title(value: Any) -> str | None:
    """A title to set: ``None`` (unchanged) or up to 200 characters without control
    characters; ``""`` clears it (the first user text shows again).

    Raises:
        InvalidEvent: it is not.
    """
    return None if value is None else _text(value, "title", MAX_TITLE_CHARS)


def _strings(value: Any) -> Iterable[str]:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, Mapping):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def check_metadata(value: Any, what: str = "metadata") -> dict[str, Any] | None:
    """Info metadata: ``None`` (unchanged), or a JSON object of at most 64 keys of 1..128
    characters, no control character in any string, at most 8 KiB encoded.

    Raises:
        InvalidEvent: it is not.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidEvent(f"{what} must be a JSON object, got {type(value).__name__}", field=what)
    doc = dict(value)
    if len(doc) > MAX_METADATA_KEYS:
        raise InvalidEvent(f"{what} has {len(doc)} keys, more than {MAX_METADATA_KEYS}", field=what)
    for key in doc:
        _text(key, f"{what} key", _MAX_KEY_CHARS, empty=False)
    check_json(doc, what)
    for s in _strings(doc):
        if CONTROL.search(s):
            raise InvalidEvent(f"{what} must not contain control characters", field=what)
    if len(canonical(doc)) > MAX_METADATA_BYTES:
        raise InvalidEvent(f"{what} is more than {MAX_METADATA_BYTES} bytes encoded", field=what)
    return doc


@dataclass(frozen=True)
class Listing:
    """Checked ``list_sessions`` arguments (see :meth:`eventstore.EventStore.list_sessions`).

    Attributes:
        owner: exact owner, or ``None``.
        metadata: key → value every listed session's metadata holds, or ``{}``.
        query: lower-cased title substring, or ``None``.
        status: one of :data:`STATUSES`, or ``None``.
        order: ``"recent"`` or ``"created"``.
        limit: the page size.
        include_lines: list kept lines too.
        after: the keyset position of the cursor (sort time, id), or ``None``.
    """

    owner: str | None
    metadata: dict[str, Any]
    query: str | None
    status: str | None
    order: str
    limit: int
    include_lines: bool
    after: tuple[int, str] | None = None

    def fingerprint(self) -> str:
        """What a cursor is bound to: the filters and order (not the position)."""
        doc = [self.owner, self.metadata, self.query, self.status, self.order, self.include_lines]
        return hashlib.sha256(canonical(doc)).hexdigest()[:16]


def check_listing(
    owner_check: Any,
    *,
    owner: Any,
    metadata: Any,
    query: Any,
    status: Any,
    order: Any,
    limit: Any,
    cursor: Any,
    include_lines: Any,
) -> Listing:
    """Check ``list_sessions`` arguments (``owner_check`` validates an owner like an id).

    Raises:
        InvalidEvent: one is malformed, or ``cursor`` is not one this listing handed out.
    """
    if owner is not None:
        owner = owner_check(owner, "owner")
    meta = check_metadata(metadata) or {}
    if query is not None:
        query = _text(query, "query", _MAX_QUERY_CHARS).lower()
    if status is not None and status not in STATUSES:
        raise InvalidEvent(f"status must be one of {', '.join(STATUSES)}, got {status!r}", field="status")
    if order not in ORDERS:
        raise InvalidEvent(f"order must be 'recent' or 'created', got {order!r}", field="order")
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise InvalidEvent(f"limit must be an integer 1..{MAX_LIMIT}, got {limit!r}", field="limit")
    if not isinstance(include_lines, bool):
        raise InvalidEvent(f"include_lines must be True or False, got {include_lines!r}", field="include_lines")
    listing = Listing(owner, meta, query, status, order, limit, include_lines)
    if cursor is None:
        return listing
    return Listing(owner, meta, query, status, order, limit, include_lines, decode_cursor(cursor, listing))


# -- the cursor -----------------------------------------------------------------------------

_CURSOR_TAG = b"eventstore.catalogue.cursor.v1\x00"
_CURSOR_MAX = 4096


def _check(body: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(_CURSOR_TAG + body).digest()[:12]).decode().rstrip("=")


def encode_cursor(listing: Listing, key: tuple[int, str]) -> str:
    """The opaque cursor after ``key`` (sort time, id) of ``listing``: the position, the
    listing it belongs to, and a check over both."""
    body = canonical([1, listing.fingerprint(), key[0], key[1]])
    return base64.urlsafe_b64encode(body).decode().rstrip("=") + "." + _check(body)


def _bad(why: str) -> InvalidEvent:
    return InvalidEvent(f"cursor is not one this listing handed out ({why})", field="cursor")


def decode_cursor(cursor: Any, listing: Listing) -> tuple[int, str]:
    """The keyset position in a cursor made by :func:`encode_cursor` for the same filters.

    Raises:
        InvalidEvent: it is not a string, was altered, or belongs to another listing.
    """
    if not isinstance(cursor, str) or not cursor or len(cursor) > _CURSOR_MAX or not cursor.isascii():
        raise _bad("not a cursor string")
    data, sep, check = cursor.partition(".")
    try:
        body = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
    except ValueError:
        raise _bad("not base64") from None
    if not sep or _check(body) != check:
        raise _bad("altered")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _bad("malformed") from None
    if (
        not isinstance(doc, list)
        or len(doc) != 4
        or doc[0] != 1
        or type(doc[2]) is not int
        or not isinstance(doc[3], str)
    ):
        raise _bad("malformed")
    if doc[1] != listing.fingerprint():
        raise _bad("made for other filters or another order")
    return doc[2], doc[3]


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionPage:
    """One page of :meth:`EventStore.list_sessions <eventstore.EventStore.list_sessions>`.

    Attributes:
        items: the sessions of the page, in the listing's order.
        next_cursor: pass it as ``cursor`` for the next page; ``None`` on the last page.
    """

    items: list[SessionInfo] = field(default_factory=list)
    next_cursor: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"items": [...], "next_cursor": ...}`` (the CLI's ``sessions --json`` with filters)."""
        return {"items": [s.to_json() for s in self.items], "next_cursor": self.next_cursor}


def name_info_changes(
    records: Iterable[tuple[int, int, str | None, str]],
    names: Mapping[int, str],
    rewinds: Iterable[RewindRow],
) -> list[InfoChange]:
    """Recorded ``set_info`` calls as :class:`InfoChange` records, each under the id it was
    made to.

    Args:
        records: ``(session_pk, changed_at, actor, changes JSON)`` in the order they were made.
        names: the current id of each row.
        rewinds: the rewind records of the rows: a row a rewind renamed to its kept id
            held the rewound id until then, so a change recorded on it before the rewind
            was made to that id.
    """
    kept = {r.kept_pk: r for r in rewinds}
    out = []
    for pk, at, actor, changes in records:
        r = kept.get(pk)
        name = r.session_id if r is not None and at <= r.rewound_at else names[pk]
        out.append(InfoChange(name, at, actor, orjson.loads(changes)))
    return out


def _micros(when: Any) -> int:
    return (when - to_datetime(0)) // _MICROSECOND


_MICROSECOND = to_datetime(1) - to_datetime(0)


def interleave_info(
    events: Sequence[RecordedEvent],
    changes: Sequence[InfoChange],
    *,
    start: int,
    since: Any = None,
    until: Any = None,
) -> list[dict[str, Any]]:
    """A history listing with the ``set_info`` calls in it: what ``history --json`` prints.

    Each event is its :meth:`~eventstore.core.records.RecordedEvent.to_json` object,
    unchanged; each change is placed, by time, after the last event recorded at or before
    it, as ``{"record": "info", "type": "set_info", "session", "version", "recorded_at",
    "actor", "changes"}`` where ``version`` is the head it was made at (as far as the
    listing tells: ``start`` for a change before its first event).

    Args:
        events: the events listed, oldest first.
        changes: the session's recorded changes (:meth:`EventStore.info_changes`).
        start: the version just before the first event listed (the listing's ``after``).
        since: when the first event listed was recorded, for a listing that does not start
            at the beginning of the history (changes before it belong to an earlier page);
            ``None`` otherwise.
        until: when the event after the last one listed was recorded, or ``None`` when the
            listing reaches the head: changes at or after it belong to a later page.
    """
    lo = None if since is None else _micros(since)
    hi = None if until is None else _micros(until)
    chosen = [
        c
        for c in changes
        if (lo is None or c.changed_at_micros >= lo) and (hi is None or c.changed_at_micros < hi)
    ]
    chosen.sort(key=lambda c: c.changed_at_micros)
    out: list[dict[str, Any]] = []
    i, version = 0, start
    for e in events:
        at = _micros(e.recorded_at)
        while i < len(chosen) and chosen[i].changed_at_micros < at:
            out.append(_info_json(chosen[i], version))
            i += 1
        out.append(e.to_json())
        version = e.version
    out.extend(_info_json(c, version) for c in chosen[i:])
    return out


def _info_json(c: InfoChange, version: int) -> dict[str, Any]:
    return {
        "record": "info",
        "type": "set_info",
        "session": c.session,
        "version": version,
        "recorded_at": iso(c.changed_at),
        "actor": c.actor,
        "changes": c.changes,
    }


def info_record_of(
    pk: int,
    records: Mapping[int, Sequence[tuple[int, str]]],
    rewinds: Iterable[RewindRow],
) -> list[str]:
    """The ``set_info`` changes (JSON, in order) that made row ``pk``'s title, owner and
    metadata: its own records, after, for a row a rewind made, those of the row it replaced
    up to the rewind (the rewind carried that row's values over).

    Args:
        records: ``(changed_at, changes JSON)`` of each row's recorded calls, in order.
        rewinds: every rewind record.
    """
    made_by = {r.new_pk: r for r in rewinds}
    chain: list[tuple[int, int | None]] = [(pk, None)]
    seen = {pk}
    while (r := made_by.get(chain[-1][0])) is not None and r.kept_pk not in seen:
        seen.add(r.kept_pk)
        chain.append((r.kept_pk, r.rewound_at))
    out: list[str] = []
    # Oldest row first: each replaced row's records count up to the rewind that replaced it.
    for row_pk, until in reversed(chain):
        out += [c for at, c in records.get(row_pk, ()) if until is None or at <= until]
    return out


def info_drift(row: CatalogueRow, changes: Iterable[str]) -> list[str]:
    """The fields among ``title``, ``owner``, ``metadata`` whose column in ``row`` is not
    what the recorded ``set_info`` calls ``changes`` (JSON, in order) leave: a column
    edited behind the library's back (the columns are outside the hash chain, the
    records are their account)."""
    title: str | None = None
    owner: str | None = None
    metadata: dict[str, Any] = {}
    for c in changes:
        doc = orjson.loads(c)
        if "title" in doc:
            title = doc["title"] or None
        if "owner" in doc:
            owner = doc["owner"]
        if "metadata" in doc:
            metadata = doc["metadata"] or {}
    stored: Any = {}
    if row.metadata is not None:
        try:
            stored = orjson.loads(row.metadata)
        except orjson.JSONDecodeError:
            stored = None  # not JSON: never what a set_info left
    return [
        name
        for name, ok in (
            ("title", row.title == title),
            ("owner", row.owner == owner),
            ("metadata", stored == metadata),
        )
        if not ok
    ]
