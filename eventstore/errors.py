"""The one error tree of eventstore.

Every failure a caller can expect surfaces as a subclass of :class:`EventStoreError`
with a message a person can act on and structured fields a program can branch on.
Driver exceptions (sqlite3, psycopg, SQLAlchemy) never escape raw: the storage layer
maps them in exactly one place and chains the original as ``__cause__``.

::

    EventStoreError
    ├── InvalidEvent            an action (or import line) is malformed; nothing was written
    │   └── EventIdConflict     an event id was reused with different content
    ├── InvalidState            a state handed to the reducer is not a session state
    ├── ConcurrencyError        expected_version did not match the session head
    ├── SessionNotFound         no session with that id
    ├── SessionExists           a new session id (branch / import) is already taken
    ├── VersionNotFound         the version is outside 0..head of the session
    │   └── CompactedError      the version lies below the session's compaction baseline
    ├── SessionErased           the session was erased; its tombstone says when, by whom, why
    ├── SessionClosed           the session was closed to writes (reads still work)
    ├── TurnStopped             a stop (or crash recovery) ended this streaming turn
    ├── TurnBusy                another streaming turn owns the session's stream
    ├── SessionRewound          a followed session was rewound; its old line lives on under a kept id
    ├── CheckpointError         a checkpoint or key file is unreadable, malformed or of the wrong kind
    ├── SchemaError             the database has no (or an older) eventstore schema
    └── StorageError            the database failed; ``retryable`` tells whether to try again
        └── SegmentCorrupt      a sealed segment does not decode to the events it stands for
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EventStoreError",
    "InvalidEvent",
    "EventIdConflict",
    "InvalidState",
    "ConcurrencyError",
    "SessionNotFound",
    "SessionExists",
    "VersionNotFound",
    "CompactedError",
    "SessionErased",
    "SessionClosed",
    "TurnStopped",
    "TurnBusy",
    "SessionRewound",
    "CheckpointError",
    "SchemaError",
    "StorageError",
    "SegmentCorrupt",
]


class EventStoreError(Exception):
    """Base class of every error eventstore raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidEvent(EventStoreError):
    """An action failed validation; the whole batch was refused and nothing was written.

    Attributes:
        index: position of the offending action in the batch (``None`` for a single action).
        field: dotted path of the offending field (``"part.messageId"``), or ``None``.
        reason: what is wrong with it, without the location.
    """

    def __init__(
        self,
        reason: str,
        *,
        field: str | None = None,
        index: int | None = None,
    ) -> None:
        where = []
        if index is not None:
            where.append(f"action #{index}")
        if field:
            where.append(f"field '{field}'")
        prefix = f"invalid event ({', '.join(where)}): " if where else "invalid event: "
        super().__init__(prefix + reason)
        self.reason = reason
        self.field = field
        self.index = index


class EventIdConflict(InvalidEvent):
    """An event id already recorded in the session was sent again with other content."""

    def __init__(self, session: str, event_id: str, version: int) -> None:
        super().__init__(
            f"event id {event_id!r} is already recorded in session {session!r} at version "
            f"{version} with different content; use a new id for a new event",
            field="event_ids",
        )
        self.session = session
        self.event_id = event_id
        self.version = version


class InvalidState(EventStoreError):
    """A state passed to the reducer is not a valid session state.

    Attributes:
        field: dotted path of the offending field (``"messages.0.parts.1.state"``), or ``None``.
        reason: what is wrong with it, without the location.
    """

    def __init__(self, reason: str, *, field: str | None = None) -> None:
        where = f" (field '{field}')" if field else ""
        super().__init__(f"invalid session state{where}: {reason}")
        self.reason = reason
        self.field = field


class ConcurrencyError(EventStoreError):
    """The session head was not the version the caller expected; nothing was written.

    Attributes:
        session: the session id.
        expected: the ``expected_version`` the caller passed.
        actual: the head the session really had (0 when it does not exist).
    """

    def __init__(self, session: str, expected: int, actual: int) -> None:
        if expected == 0:
            msg = f"session {session!r} already exists (head {actual}); expected a new session"
        else:
            msg = (
                f"session {session!r} is at version {actual}, not {expected}: "
                "someone else appended first; reload and retry"
            )
        super().__init__(msg)
        self.session = session
        self.expected = expected
        self.actual = actual


class SessionNotFound(EventStoreError):
    """No session with this id exists."""

    def __init__(self, session: str) -> None:
        super().__init__(f"session {session!r} not found")
        self.session = session


class SessionExists(EventStoreError):
    """The id chosen for a new session (a branch or an import) is already taken."""

    def __init__(self, session: str) -> None:
        super().__init__(f"session {session!r} already exists; choose another id")
        self.session = session


class VersionNotFound(EventStoreError):
    """The requested version is not in ``0..head`` of the session."""

    def __init__(self, session: str, version: int, head: int, message: str | None = None) -> None:
        super().__init__(
            message
            or f"session {session!r} has no version {version} (versions run 0..{head})"
        )
        self.session = session
        self.version = version
        self.head = head


class CompactedError(VersionNotFound):
    """The requested version lies below the session's compaction baseline."""

    def __init__(self, session: str, version: int, baseline: int, head: int) -> None:
        super().__init__(
            session,
            version,
            head,
            f"session {session!r} was compacted up to version {baseline}; "
            f"version {version} is no longer loadable (load {baseline}..{head})",
        )
        self.baseline = baseline


class SessionErased(EventStoreError):
    """The session was erased on request; only its tombstone is left.

    Attributes:
        session: the session id.
        erased_at: when, as microseconds since the Unix epoch (UTC).
        actor: who erased it (``None`` when not given).
        reason: why.
    """

    def __init__(self, session: str, *, erased_at: int, actor: str | None, reason: str) -> None:
        by = f" by {actor!r}" if actor else ""
        super().__init__(f"session {session!r} was erased{by}: {reason}")
        self.session = session
        self.erased_at = erased_at
        self.actor = actor
        self.reason = reason


class SessionClosed(EventStoreError):
    """The session was closed to writes: appends, turns and branches into it are refused.

    Attributes:
        session: the session id.
        reason: why it was closed (``None`` when not given).
    """

    def __init__(self, session: str, reason: str | None) -> None:
        why = f": {reason}" if reason else ""
        super().__init__(f"session {session!r} is closed to writes{why}; read it or branch from it")
        self.session = session
        self.reason = reason


class TurnStopped(EventStoreError):
    """The streaming turn was ended by a stop (or by crash recovery): nothing more of it
    is stored.

    Attributes:
        session: the session id.
        version: the version of the event that ended the turn, when known.
        dropped: how many written parts were still buffered and were dropped.
    """

    def __init__(self, session: str, version: int | None, dropped: int) -> None:
        at = f" at version {version}" if version is not None else ""
        super().__init__(
            f"the turn on session {session!r} was stopped{at}; {dropped} buffered part(s) "
            "were dropped and nothing more of it is stored"
        )
        self.session = session
        self.version = version
        self.dropped = dropped


class TurnBusy(EventStoreError):
    """Another streaming turn holds the session's writer lease.

    Attributes:
        session: the session id.
        seen_seconds_ago: how long ago that turn last flushed or renewed its lease.
    """

    def __init__(self, session: str, seen_seconds_ago: float) -> None:
        super().__init__(
            f"session {session!r} has a streaming turn in progress (its writer was last seen "
            f"{seen_seconds_ago:.1f} s ago); wait for it, stop it, or `eventstore recover` it "
            "if its process died"
        )
        self.session = session
        self.seen_seconds_ago = seen_seconds_ago


class SessionRewound(EventStoreError):
    """The session being followed was rewound: its id now names a line that ends at
    ``to``, and the events the follower was reading on from live on under ``kept``.

    Raised by a follower once it has handed out every event committed before the rewind.

    Attributes:
        session: the session id.
        to: the version the session was rewound to.
        kept: the id of the line that keeps the events after ``to``.
    """

    def __init__(self, session: str, to: int, kept: str) -> None:
        super().__init__(
            f"session {session!r} was rewound to version {to}; the events after it are kept as {kept!r}"
        )
        self.session = session
        self.to = to
        self.kept = kept


class CheckpointError(EventStoreError):
    """A checkpoint or a key cannot be used: unreadable, malformed, or of the wrong kind."""


class SchemaError(EventStoreError):
    """The database lacks the eventstore schema or has an older one."""


class StorageError(EventStoreError):
    """The database failed in a way the caller did not cause.

    Attributes:
        retryable: ``True`` when the same call may succeed if made again (a lost
            connection, a serialization failure, a busy SQLite file). Appends are only
            safe to retry blindly when they carry ``event_ids``.
    """

    def __init__(self, message: str, *, retryable: bool = False, **context: Any) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.context = context


class SegmentCorrupt(StorageError):
    """A sealed segment's body does not decode to the events it replaced: it was altered
    (its events do not hash to the end hash the database copied from the rows) or is not
    a segment body at all. Every read that meets it fails; ``verify`` reports it."""
