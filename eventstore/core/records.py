"""What the store returns: small frozen records, no behaviour beyond rendering.

- :class:`AppendResult` — the outcome of :meth:`EventStore.append`.
- :class:`RecordedEvent` — one event as :meth:`EventStore.history` yields it.
- :class:`SessionInfo` — one row of :meth:`EventStore.sessions`.
- :class:`VerifyReport` — what :meth:`EventStore.verify` found, as :class:`Problem` records.
- :class:`InfoChange` — one recorded ``set_info`` (who, when, what).
- :class:`CompactionRecord` — what the compaction storage primitive did.
- :class:`Recovery` — what :meth:`EventStore.recover` did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson

from eventstore.core.text import iso

__all__ = [
    "AppendResult",
    "RecordedEvent",
    "SessionInfo",
    "VerifyReport",
    "Problem",
    "CompactionRecord",
    "Recovery",
    "to_datetime",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def to_datetime(micros: int) -> datetime:
    """An aware UTC datetime from microseconds since the Unix epoch (lossless)."""
    return _EPOCH + timedelta(microseconds=micros)


@dataclass(frozen=True)
class AppendResult:
    """The outcome of an append.

    Attributes:
        session: the session appended to.
        version: the session's head after the append (the last new event's version).
        first_version: the version of the batch's first event.
        count: how many events the batch holds.
        event_ids: the ids given with the batch, or ``None``.
        recorded_at: when the batch was recorded (aware UTC; one timestamp per batch).
        replayed: ``True`` when this is an idempotent retry that wrote nothing
            (not part of equality: a retry returns a result equal to the original).
    """

    session: str
    version: int
    first_version: int
    count: int
    event_ids: tuple[str, ...] | None
    recorded_at: datetime
    replayed: bool = field(default=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The CLI's ``append --json`` object."""
        return {
            "session": self.session,
            "version": self.version,
            "first_version": self.first_version,
            "count": self.count,
            "event_ids": None if self.event_ids is None else list(self.event_ids),
            "recorded_at": iso(self.recorded_at),
            "replayed": self.replayed,
        }


@dataclass(frozen=True)
class RecordedEvent:
    """One recorded event.

    Attributes:
        session_id: the session that recorded it (an ancestor's id for a branch's
            inherited prefix).
        version: its version in the lineage.
        event_id: the caller's idempotency id, or ``None``.
        type: the action type (``send``, ``part``, ``toolPhase``, ...).
        action: the action in its wire shape (see ``docs/format.md``).
        turn: number of ``send`` events up to and including this one.
        recorded_at: when it was recorded (aware UTC).
        actor: who recorded it, or ``None``.
        metadata: the JSON object recorded with it, or ``None``.
        hash: hex SHA-256 chaining it to the previous event.
        position: where the event sits in the global feed (an opaque string to pass
            back as ``feed(after=...)``); ``None`` outside :meth:`EventStore.feed`.
        native_bytes: the provider-native data recorded with it (JSON text, exactly the
            bytes given to ``append``), or ``None``; the reducer never reads it.
    """

    session_id: str
    version: int
    event_id: str | None
    type: str
    action: dict[str, Any]
    turn: int
    recorded_at: datetime
    actor: str | None
    metadata: dict[str, Any] | None
    hash: str
    position: str | None = None
    native_bytes: bytes | None = None

    @property
    def native(self) -> Any:
        """The provider-native data as a JSON value (parsed from :attr:`native_bytes`),
        or ``None`` when the event carries none."""
        return None if self.native_bytes is None else orjson.loads(self.native_bytes)

    def to_json(self) -> dict[str, Any]:
        """The CLI's ``--json`` shape (``recorded_at`` as ISO 8601 UTC with ``Z``;
        ``position`` only for an event read from the feed; ``native`` only for an event
        that carries provider-native data)."""
        doc: dict[str, Any] = {
            "session": self.session_id,
            "version": self.version,
            "event_id": self.event_id,
            "type": self.type,
            "action": self.action,
            "turn": self.turn,
            "recorded_at": iso(self.recorded_at),
            "actor": self.actor,
            "metadata": self.metadata,
            "hash": self.hash,
        }
        if self.position is not None:
            doc["position"] = self.position
        if self.native_bytes is not None:
            doc["native"] = self.native
        return doc


@dataclass(frozen=True)
class SessionInfo:
    """One session as :meth:`EventStore.sessions` lists it.

    Attributes:
        id: the session id.
        parent: the id of the session it was branched from, or ``None``.
        fork_version: the parent version it was branched at, or ``None``.
        head: its newest version.
        baseline: versions below this were compacted (0 = none).
        created_at: when it was created (aware UTC).
        head_turn: the turn number at ``head``.
        closed_at: when the session was closed to writes, or ``None`` (open).
        closed_reason: why it was closed, or ``None``.
        interrupted: its last turn was interrupted (crash recovery, or a turn left with
            an exception) and nothing continued it yet.
        writer_seen: when the streaming turn that holds the session last flushed or
            renewed its lease, or ``None`` when no turn holds it.
        title: the title set with ``set_info``, else the first user text cut to 80
            characters; ``None`` before any ``send``.
        owner: the owner set with ``set_info``, or ``None``.
        metadata: the info metadata set with ``set_info`` (``{}`` when unset; not the
            events' metadata).
        updated_at: when its newest own event was recorded (a branch without events of
            its own: when it was made).
        turns: its number of turns (``send`` events) up to ``head``.
        status: the fold's status at ``head``: ``idle``, ``streaming`` or ``error``.
    """

    id: str
    parent: str | None
    fork_version: int | None
    head: int
    baseline: int
    created_at: datetime
    head_turn: int = 0
    closed_at: datetime | None = None
    closed_reason: str | None = None
    interrupted: bool = False
    writer_seen: datetime | None = None
    title: str | None = None
    owner: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    updated_at: datetime | None = None
    turns: int = 0
    status: str = "idle"

    @property
    def closed(self) -> bool:
        """Whether the session is closed to writes."""
        return self.closed_at is not None

    def to_json(self) -> dict[str, Any]:
        """The CLI's ``sessions --json`` object."""
        return {
            "id": self.id,
            "parent": self.parent,
            "fork_version": self.fork_version,
            "head": self.head,
            "baseline": self.baseline,
            "head_turn": self.head_turn,
            "created_at": iso(self.created_at),
            "closed": self.closed,
            "closed_at": None if self.closed_at is None else iso(self.closed_at),
            "closed_reason": self.closed_reason,
            "interrupted": self.interrupted,
            "writer_seen": None if self.writer_seen is None else iso(self.writer_seen),
            "title": self.title,
            "owner": self.owner,
            "metadata": self.metadata,
            "updated_at": None if self.updated_at is None else iso(self.updated_at),
            "turns": self.turns,
            "status": self.status,
        }


@dataclass(frozen=True)
class Problem:
    """One integrity problem :meth:`EventStore.verify` found.

    Attributes:
        session: the session checked (for an inherited event, the branch that reads it).
        version: the version where the problem is.
        kind: what is wrong, one of ``"missing-events"``, ``"hash-mismatch"``,
            ``"bad-payload"``, ``"bad-native"`` (provider-native data that is not valid
            JSON), ``"snapshot-mismatch"``, ``"head-hash"``,
            ``"beyond-head"``, ``"turn-mismatch"``, ``"head-turn"``, ``"below-baseline"``
            (an event row below the baseline that no compaction recorded),
            ``"baseline-mismatch"`` (the baseline snapshot or the session's baseline hash
            is not what its compaction recorded), ``"unrecorded-baseline"`` (a baseline
            with no compaction record: compacted before revision 0002, or written behind
            the library's back), ``"info-edited"`` (the title, owner or metadata column
            is not what the recorded ``set_info`` calls left), ``"sealed-id"`` (the
            sealed event ids table disagrees with a sealed event), ``"unreadable"`` (the
            session could not be checked at all); with a checkpoint also :class:`~eventstore.core.checkpoints.CheckpointProblem`
            kinds (``"vanished"``, ``"rewritten"``, ``"head_moved_back"``, ...). As a
            notice (not a problem): ``"erased"``.
        message: one readable line naming the session and the version.
    """

    session: str
    version: int
    kind: str
    message: str

    def __str__(self) -> str:
        return self.message

    def to_json(self) -> dict[str, Any]:
        """``{"session", "version", "kind", "message"}``."""
        return {"session": self.session, "version": self.version, "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class InfoChange:
    """One recorded ``set_info`` call.

    Attributes:
        session: the session id the call was made to (a line kept by a rewind reports
            the changes made before it under the id it was rewound away from).
        changed_at_micros: when (microseconds since the Unix epoch, UTC).
        actor: who, or ``None``.
        changes: what was set: a subset of ``{"title", "owner", "metadata"}`` with the new values.
    """

    session: str
    changed_at_micros: int
    actor: str | None
    changes: dict[str, Any]

    @property
    def changed_at(self) -> datetime:
        """When, as an aware UTC datetime."""
        return to_datetime(self.changed_at_micros)

    def to_json(self) -> dict[str, Any]:
        """``{"session", "changed_at" (ISO 8601 UTC), "actor", "changes"}``."""
        return {
            "session": self.session,
            "changed_at": iso(self.changed_at),
            "actor": self.actor,
            "changes": self.changes,
        }


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`EventStore.verify` found.

    Attributes:
        ok: ``True`` when no problem was found.
        problems: one :class:`Problem` per finding.
        sessions: the sessions checked.
        events: how many events were checked.
        snapshots: how many snapshots were compared with the fold of their events.
        notices: findings that are not failures: sessions erased through the API
            (kind ``"erased"``, naming who, when and why) and rewinds (kind ``"rewound"``).
        checkpoint: the ``created_at`` (ISO 8601) of the checkpoint verified against, or
            ``None``.
        info_changes: every recorded ``set_info`` of the sessions checked (who, when,
            what), oldest first: the catalogue fields are outside the hash chain, so this
            is their audit trail.
    """

    ok: bool
    problems: list[Problem]
    sessions: list[str] = field(default_factory=list)
    events: int = 0
    snapshots: int = 0
    notices: list[Problem] = field(default_factory=list)
    checkpoint: str | None = None
    info_changes: list[InfoChange] = field(default_factory=list)

    def for_session(self, session: str) -> list[Problem]:
        """The problems found while checking ``session``."""
        return [p for p in self.problems if p.session == session]

    def to_json(self) -> dict[str, Any]:
        """The CLI's ``verify --json`` object."""
        return {
            "ok": self.ok,
            "problems": [p.to_json() for p in self.problems],
            "sessions": list(self.sessions),
            "events": self.events,
            "snapshots": self.snapshots,
            "notices": [p.to_json() for p in self.notices],
            "checkpoint": self.checkpoint,
            "info_changes": [c.to_json() for c in self.info_changes],
        }


@dataclass(frozen=True)
class CompactionRecord:
    """What the compaction storage primitive did.

    Attributes:
        session: the session compacted.
        baseline: the new baseline version (the state there is now a snapshot).
        previous_baseline: the baseline before.
        deleted: events deleted.
        kept_for_branches: events at or below this version were kept because a branch
            forked there still reads them (``None``: no branch).
    """

    session: str
    baseline: int
    previous_baseline: int
    deleted: int
    kept_for_branches: int | None


@dataclass(frozen=True)
class Recovery:
    """What crash recovery did (:meth:`EventStore.recover`).

    Attributes:
        version: the version of the interruption part it appended.
        messages: the continuation seed: ``resumable`` of the state's messages (what to
            send the model to continue the reply).
    """

    version: int
    messages: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        """``{"version", "messages"}``."""
        return {"version": self.version, "messages": self.messages}
