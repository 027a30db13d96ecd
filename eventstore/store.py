"""EventStore: the public facade. Every method validates and delegates, nothing more.

::

    with EventStore("sqlite:///chat.db") as store:
        store.migrate()
        store.append("s1", [{"type": "send", "id": "u-1", "text": "hi"}], expected_version=0)
        state = store.load("s1")              # head
        old = store.load("s1", version=0)     # any version
        alt = store.branch("s1", at=1)        # O(1) fork

The machinery is in :mod:`eventstore.engine.engine` (appends, loads, branches, the compaction
primitive) over the pure :mod:`eventstore.core.appends`; the features are modules that take
the engine: :mod:`eventstore.features.timetravel` (diff, replay, turns), :mod:`eventstore.features.compaction`,
:mod:`eventstore.features.exporting` / :mod:`~eventstore.features.importing` and :mod:`eventstore.features.integrity`. The wire
format and the reducer's rules are described in ``docs/format.md``.

One ``EventStore`` may be shared by many threads (a sync web server does exactly this):
each thread gets its own pooled connection, and the per-process caches are taken and put
back under a lock (see :class:`eventstore.core.appends.AppendPlanner`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import IO, Any

from eventstore.core.catalogue import InfoChange, SessionPage
from eventstore.core.checkpoints import Checkpoint
from eventstore.core.diff import SessionDiff
from eventstore.core.feed_rules import Follower
from eventstore.core.models import Action, SessionState
from eventstore.core.records import AppendResult, RecordedEvent, Recovery, SessionInfo, VerifyReport
from eventstore.core.turn_rules import RecoveryStatus
from eventstore.core.turn_view import Turn
from eventstore.engine import catalogue
from eventstore.engine import turn_recovery
from eventstore.engine.engine import DEFAULT_SNAPSHOT_EVERY
from eventstore.engine.facade import StoreBase
from eventstore.engine.turns import DEFAULT_MAX_DELAY, StreamingTurn, TurnWriter
from eventstore.features import audit, compaction, exporting, importing, timetravel
from eventstore.features import integrity, report, rewind
from eventstore.features.compaction import CompactResult
from eventstore.features.timetravel import ReplayStep
from eventstore.features.importing import ImportResult

__all__ = ["EventStore", "DEFAULT_SNAPSHOT_EVERY"]


class EventStore(StoreBase):
    """Event-sourced chat sessions on SQLite or PostgreSQL.

    Args:
        url: a SQLAlchemy URL: ``sqlite:///path.db`` or ``postgresql+psycopg://user:pw@host/db``.
        snapshot_every: store the state every this many versions (a load then folds
            fewer events than this).
        max_event_bytes: the largest encoded action (and metadata) accepted.
        max_id_length: the longest session id, event id or actor accepted.
        seal: rewrite each closed turn's events in the background into one compressed
            segment (``False``: keep every event a row). Invisible to every reader. A
            :class:`~eventstore.SealPolicy` says when the background sealer works: it
            yields to this store's appends, within a bound on the closed turns waiting
            (``True`` is ``SealPolicy()``; see docs/sealing.md).
        **storage_options: backend options (``busy_timeout_ms`` and ``pool_size`` for
            SQLite; for PostgreSQL ``pool_size``, ``max_overflow``, ``pool_timeout``
            (seconds to wait for a connection), ``connect_timeout``, ``prepare_threshold``
            (``None``: never prepare a statement, as PgBouncer's transaction mode needs)
            and ``ping_after_idle_s``: the append fast path skips the connection
            pre-ping unless the pooled connection sat idle longer than this or looks
            dropped; default 0.5 s).

    The store opens no connection until first used. Use it as a context manager, or call
    :meth:`close`, to release its connections. It is safe to share between threads.

    Raises:
        StorageError: the URL is not a supported database URL.
        InvalidEvent: ``url`` is not a string, or ``snapshot_every`` or a limit is not a
            positive integer.
    """

    def _open_writers(self) -> None:
        self._streams = TurnWriter(self._engine)

    # -- lifecycle and schema -----------------------------------------------------------

    def close(self) -> None:
        """Release every database connection. The store must not be used afterwards.

        Its followers (:meth:`follow`, :meth:`feed`) end, wherever they are iterated: a
        read one of them is running is waited for (at most ten seconds), so no statement
        of the store is left running when ``close`` returns.
        """
        self._streams.close()
        self._engine.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision (Alembic ``upgrade head``).

        Idempotent, and safe to run from several processes at once.

        Raises:
            StorageError: the database failed.
        """
        self._engine.migrate()

    def check_schema(self) -> None:
        """Make sure the database has this version's schema.

        Raises:
            SchemaError: the schema is missing or older; the message says to run
                ``eventstore migrate``.
        """
        self._engine.check_schema()

    # -- writes -------------------------------------------------------------------------

    def append(
        self,
        session: str,
        actions: Iterable[Mapping[str, Any] | Action],
        *,
        expected_version: int | None = None,
        event_ids: Sequence[str] | None = None,
        actor: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        native: Sequence[Any] | None = None,
    ) -> AppendResult:
        """Append a batch of actions to a session, atomically.

        The session is created by its first append. Every action is validated before
        anything is written; the batch then gets consecutive versions after the head, one
        recorded timestamp, turn numbers and hash-chain links.

        Args:
            session: the session id (1..``max_id_length`` characters, no control characters).
            actions: action dicts in the wire shape, or the typed action models
                (:class:`~eventstore.SendAction`, :class:`~eventstore.PartAction`, ...;
                see ``docs/format.md``); at least one.
            expected_version: ``None`` for no check; ``0``: the session must not exist yet;
                ``n``: the head must be ``n``.
            event_ids: one id per action. Appending the same ids with the same content
                again returns the original result and writes nothing.
            actor: who is appending (recorded on every event of the batch).
            metadata: a JSON object recorded on every event of the batch.
            native: provider-native data the reducer ignores (an item's exact JSON, token
                usage, a file reference): one entry per action, ``None`` for none. An
                entry is ``bytes`` or ``str`` of JSON text, stored byte for byte, or any
                JSON value, stored as canonical JSON; each within ``max_event_bytes``.
                It is covered by the hash chain and read back as
                :attr:`RecordedEvent.native` / :attr:`RecordedEvent.native_bytes`.

        Returns:
            The :class:`AppendResult`; ``version`` is the new head.

        Raises:
            InvalidEvent: an action is malformed, too large, the batch is empty, an id is
                bad, ``metadata`` is not a JSON object, or ``native`` is not one valid
                JSON entry per action. Nothing was written.
            EventIdConflict: an event id is already recorded with other content.
            ConcurrencyError: the head is not ``expected_version``; nothing was written.
            SchemaError: the database is not migrated.
            StorageError: the database failed (``retryable`` tells whether to retry).
        """
        return self._engine.append(
            session,
            actions,
            expected_version=expected_version,
            event_ids=event_ids,
            actor=actor,
            metadata=metadata,
            native=native,
        )

    def turn(
        self,
        session: str,
        send_action: Mapping[str, Any] | Action,
        *,
        actor: str | None = None,
        max_delay: float = DEFAULT_MAX_DELAY,
    ) -> StreamingTurn:
        """A streaming turn: persist the user's message, then stream the reply into the log.

        ::

            with store.turn("s1", {"type": "send", "id": "u-1", "text": "hi"}) as turn:
                turn.write({"type": "message-start", "messageId": "a-1"})
                turn.write({"type": "text-delta", "messageId": "a-1", "text": "Hel"})

        Entering returns once ``send_action`` is durable (another process can read it
        before the first part is written) and the turn holds the session's writer lease.
        ``turn.write(part)`` buffers; the writes of every turn open on this store are
        committed together, one transaction per flush. Step-ending parts (``tool-call``,
        ``tool-result``, ``tool-error``, ``finish``, ``error``, ``toolPhase``, ``stop``) are
        durable when ``write`` returns; deltas within ``max_delay`` seconds (while the
        database takes no commit, ``write`` waits once a delta is ``max_delay`` old, so
        that stays true). A stop appended
        by anyone ends the turn (``turn.stopped``; buffered parts are dropped and counted in
        ``turn.dropped``; later writes raise :class:`~eventstore.TurnStopped`). Leaving the
        block with an exception flushes, appends an interruption ``error`` part and
        re-raises.

        Args:
            session: the session id (created by the turn when new).
            send_action: the ``send`` that opens the turn, or a ``retry`` to continue an
                interrupted reply.
            actor: recorded on every event of the turn.
            max_delay: seconds a delta may wait before it is durable (0..60).

        Raises (on entering):
            InvalidEvent: an argument is malformed.
            SessionClosed: the session was closed.
            TurnBusy: another turn (in any process) holds the session.
        """
        return StreamingTurn(self._streams, session, send_action, actor=actor, max_delay=max_delay)

    def recover(self, session: str, *, stale_after: float = 30.0) -> Recovery | None:
        """Close a turn whose writer died, and return the continuation seed.

        When the session is ``streaming`` and no turn in any process has written to it or
        renewed its lease for ``stale_after`` seconds, appends the interruption part
        (``{"type": "part", "part": {"type": "error", "error": "The response was
        interrupted."}}``: every open tool call is cancelled) and returns
        :class:`~eventstore.Recovery` with ``resumable`` of the messages. Otherwise writes
        nothing and returns ``None``. A live turn renews its lease every second, so it is
        never interrupted.

        Raises:
            InvalidEvent: an argument is malformed (``stale_after`` must be positive).
            SessionNotFound: no such session.
            SessionClosed: the session was closed.
        """
        return turn_recovery.recover(self._engine, session, stale_after=stale_after)

    def recovery_status(self, session: str, *, stale_after: float = 30.0) -> RecoveryStatus:
        """Whether :meth:`recover` would interrupt the session now, and if not, why not
        (``not-streaming``, ``writer-alive``, ``closed``) and, for a live writer, when it
        becomes recoverable (``recoverable_at``). Writes nothing.

        Raises:
            InvalidEvent: an argument is malformed.
            SessionNotFound: no such session.
            SessionErased: it was erased.
        """
        return turn_recovery.recovery_status_of(self._engine, session, stale_after=stale_after)

    def close_session(self, session: str, *, reason: str | None = None) -> None:
        """Close a session to writes: later appends, turns and branches into it raise
        :class:`~eventstore.SessionClosed`; reads, branches from it and diffs still work,
        and :meth:`sessions` shows it closed with the reason. A session still streaming
        (a live turn, or one whose writer died) is ended first, in the same transaction, with
        the interruption error part (actor ``"close"``), so it is never left stuck; a live
        turn on it stops at its next flush, its unflushed parts dropped.

        Raises:
            InvalidEvent: an argument is malformed.
            SessionNotFound: no such session.
        """
        turn_recovery.close_session(self._engine, session, reason=reason)

    def branch(self, session: str, *, at: int | None = None, new_id: str | None = None) -> str:
        """Fork a session at a version, copy-on-write (no event is copied).

        The branch's head is ``at`` and its state there is the parent's; its next append
        gets version ``at + 1``. Branches of branches work the same way.

        Args:
            session: the session to fork.
            at: the version to fork at; ``None`` for the head.
            new_id: the branch's id; ``None`` generates ``"<session>-<8 hex>"``.

        Returns:
            The branch's id.

        Raises:
            InvalidEvent: an argument is malformed (``new_id`` is not a valid id, ``at``
                is not an integer).
            SessionNotFound: no such session.
            SessionExists: ``new_id`` is taken.
            VersionNotFound: ``at`` is negative or beyond the head.
            CompactedError: ``at`` lies below the session's baseline.
        """
        return self._engine.branch(session, at=at, new_id=new_id)

    def rewind(
        self,
        session: str,
        *,
        to: int,
        expected_version: int | None = None,
        actor: str | None = None,
        reason: str | None = None,
    ) -> str | None:
        """Rewind a session to an earlier version, keeping the line it leaves (an edit, a
        regenerate or an undo).

        The session's head becomes ``to`` and its state the one it had there. No event
        is changed, copied or deleted: the events after ``to`` stay readable, byte for
        byte, under the returned kept id ``"{session}~{n}"``, a line closed to writes
        that shares the session's events up to ``to`` and keeps the old head (branch it
        to continue it). O(1) in the number of events. Recorded for the audit: who, when,
        why, from which head to which version, the kept id.

        Args:
            session: the session to rewind.
            to: the version that becomes the head (0: an empty session).
            expected_version: the head the caller expects, as for :meth:`append`.
            actor: who rewinds it (kept in the record).
            reason: why (kept in the record).

        Returns:
            The kept id, or ``None`` when ``to`` is the head (nothing is written).

        Raises:
            InvalidEvent: an argument is malformed.
            SessionNotFound: no such session.
            SessionErased: it was erased.
            VersionNotFound: ``to`` is beyond the head.
            CompactedError: ``to`` lies below the compaction baseline.
            ConcurrencyError: the head is not ``expected_version``.
            SessionClosed: the session is closed to writes (a kept line is).
            TurnBusy: a streaming turn holds the session.
        """
        return rewind.rewind(
            self._engine, session, to=to, expected_version=expected_version, actor=actor, reason=reason
        )

    def lines(self, session: str) -> list[SessionInfo]:
        """The lines rewound away from a session, oldest first.

        Each is listed as :meth:`sessions` lists it: ``parent`` is ``session`` and
        ``fork_version`` the version it was rewound to.

        Raises:
            InvalidEvent: the id is malformed.
            SessionNotFound: no such session.
            SessionErased: it was erased.
        """
        return rewind.lines(self._engine, session)

    def seal(self, session: str | None = None) -> int:
        """Seal every closed turn now, of one session or of all, and return how many turns
        were sealed once they are.

        A turn is closed once a later turn of its session has begun; each closed turn's
        events become one compressed segment, in the transaction that removes their rows.
        Nothing any reader sees changes: loads at every version, history, the feed's
        positions and order, export, verify and checkpoints.

        Raises:
            InvalidEvent: ``session`` is not a valid id.
            SessionNotFound: no such session.
            StorageError: the database failed.
        """
        return self._engine.seal(session)

    def compact(
        self,
        session: str,
        *,
        upto: int,
        archive: str | os.PathLike[str] | IO[str] | None = None,
        actor: str | None = None,
    ) -> CompactResult:
        """Fold events ``1..upto`` into a baseline; see :func:`eventstore.features.compaction.compact`
        (``actor`` is kept in the compaction record)."""
        return compaction.compact(self._engine, session, upto=upto, archive=archive, actor=actor)

    def compact_all(
        self, *, keep_last_turns: int, progress: Callable[[int, int, str], None] | None = None
    ) -> list[CompactResult]:
        """Compact every session keeping its last N turns; see :func:`eventstore.features.compaction.compact_all`."""
        return compaction.compact_all(self._engine, keep_last_turns=keep_last_turns, progress=progress)

    def import_(
        self, src: IO[str] | Iterable[str], *, progress: Callable[[int, int], None] | None = None
    ) -> list[ImportResult]:
        """Recreate sessions from an export file; see :func:`eventstore.features.importing.import_`."""
        return importing.import_(self._engine, src, progress=progress)

    # -- reads --------------------------------------------------------------------------

    def head(self, session: str) -> int:
        """The newest version of a session.

        Raises:
            InvalidEvent: ``session`` is not a valid id.
            SessionNotFound: no such session.
        """
        return self._engine.head(session)

    def load(self, session: str, *, version: int | None = None) -> SessionState:
        """The state of a session at a version.

        Args:
            session: the session id.
            version: ``None`` for the head; ``0`` for the initial state; else the state
                after that many events (a branch's versions ≤ its fork point are its
                parent's).

        Returns:
            The :class:`SessionState`.

        Raises:
            InvalidEvent: ``session`` is not a valid id or ``version`` not an integer.
            SessionNotFound: no such session.
            VersionNotFound: ``version`` is negative or beyond the head.
            CompactedError: ``version`` lies below the session's compaction baseline.
        """
        return SessionState.from_trusted(self._engine.load(session, version))

    def history(
        self,
        session: str,
        *,
        after: int | None = None,
        upto: int | None = None,
        limit: int | None = None,
        desc: bool = False,
    ) -> Iterator[RecordedEvent]:
        """The events of a session's lineage, oldest first (newest first with ``desc``).

        A branch includes the prefix it inherits, each event carrying the id of the session
        that recorded it. After a compaction, history starts after the baseline. Events are
        read in chunks, so a long session never sits in memory at once.

        Args:
            after: only versions greater than this.
            upto: only versions up to and including this.
            limit: at most this many events.
            desc: newest first.

        Returns:
            An iterator of :class:`RecordedEvent`. The session is looked up when this is
            called (so a missing session raises here); events are read as you iterate.

        Raises:
            InvalidEvent: an argument is malformed (``limit`` negative, a version not an
                integer, ``desc`` not a bool).
            SessionNotFound: no such session.
        """
        return self._engine.history(session, after=after, upto=upto, limit=limit, desc=desc)

    def follow(self, session: str, *, after: int = 0, idle_timeout: float | None = None) -> Follower:
        """A session's events after a version, oldest first, then each new one as soon as
        it is committed — every event exactly once, none skipped.

        The past comes as :meth:`history` gives it (a branch's inherited prefix included);
        then the follower waits for new events without polling the database in a loop
        (PostgreSQL: one ``LISTEN`` connection per store wakes every follower when a store
        notifies after its commits, and a silent follower reads again every second;
        SQLite: a dedicated connection watches ``PRAGMA data_version``).

        Args:
            session: the session to follow.
            after: start after this version (0: from the start; a version ``n`` seen
                before, to resume).
            idle_timeout: stop after this many seconds without a new event; ``None``
                follows until the iterator is closed.

        Returns:
            A :class:`~eventstore.Follower`: iterate it for :class:`RecordedEvent` records
            (``position`` is ``None``); ``lag`` and ``caught_up`` tell how far behind it is.
            Events a compaction removed before the follower read them are not yielded.

        Raises:
            InvalidEvent: an argument is malformed.
            SessionNotFound: no such session.
            VersionNotFound: ``after`` is beyond the session's head.
            SessionRewound: (while iterating) the session was rewound; raised once every
                event committed before the rewind was yielded (``.to``, ``.kept``).
        """
        return self._engine.follow(session, after=after, idle_timeout=idle_timeout)

    def feed(self, *, after: str | None = None, idle_timeout: float | None = 1.0) -> Follower:
        """The events of every session in one stream, each with its ``position``.

        Never skips an event — also one whose transaction committed after an event placed
        later — and never yields one twice; each session's events come in version order.
        Store the ``position`` of the last event handled and pass it as ``after`` to
        resume right after it, in this process or another, across server restarts.
        On PostgreSQL the feed reads only events below the oldest transaction that can
        still write one, so an event writer's transaction held open holds the feed back
        until it ends (see ``lag``); other transactions on the server do not. Events removed by a compaction or an erasure before the feed reached
        them are not yielded.

        Args:
            after: a position from an earlier event (``None``: from the start).
            idle_timeout: stop after this many seconds without a new event; ``None``
                follows forever.

        Returns:
            A :class:`~eventstore.Follower` of :class:`RecordedEvent` records with
            ``position`` set; its ``position`` is the last one handed out.

        Raises:
            InvalidEvent: ``after`` is not a position, or ``idle_timeout`` not a number
                of seconds >= 0.
        """
        return self._engine.feed(after=after, idle_timeout=idle_timeout)

    def sessions(self) -> list[SessionInfo]:
        """Every session (roots and branches), oldest first."""
        return self._engine.sessions()

    # -- the catalogue ------------------------------------------------------------------

    def set_info(
        self,
        session: str,
        *,
        title: str | None = None,
        owner: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        actor: str | None = None,
    ) -> SessionInfo:
        """Set a session's title, owner or info metadata (what a sidebar shows and filters on).

        Not an event: the log and the head do not move. Each call that sets something is
        recorded (who, when, what): see :meth:`info_changes`.

        Args:
            session: an existing session.
            title: the title (up to 200 characters, no control characters); ``""`` clears
                it, so that the first user text shows again; ``None`` leaves it unchanged.
            owner: the owner (an id: up to ``max_id_length`` characters, no control
                characters); ``None`` leaves it unchanged.
            metadata: a JSON object (at most 64 keys, 8 KiB encoded, no control
                characters) that replaces the session's info metadata as a whole (``{}``
                clears it); ``None`` leaves it unchanged.
            actor: who made the change (recorded).

        Returns:
            The session's :class:`SessionInfo` after the change.

        Raises:
            InvalidEvent: an argument is malformed; nothing was changed.
            SessionNotFound: no such session (:class:`~eventstore.SessionErased` if erased).
        """
        return catalogue.set_info(
            self._engine, session, title=title, owner=owner, metadata=metadata, actor=actor
        )

    def info(self, session: str) -> SessionInfo:
        """One session's :class:`SessionInfo` (as :meth:`sessions` and :meth:`list_sessions` give it).

        Raises:
            InvalidEvent: ``session`` is not a valid id.
            SessionNotFound: no such session.
        """
        return catalogue.info(self._engine, session)

    def info_changes(self, session: str) -> list[InfoChange]:
        """Every :meth:`set_info` recorded for a session, oldest first: who, when, what.

        Raises:
            InvalidEvent: ``session`` is not a valid id.
            SessionNotFound: no such session.
        """
        return catalogue.info_changes(self._engine, session)

    def list_sessions(
        self,
        *,
        owner: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        query: str | None = None,
        status: str | None = None,
        order: str = "recent",
        limit: int = 50,
        cursor: str | None = None,
        include_lines: bool = False,
    ) -> SessionPage:
        """One page of sessions, for a sidebar: ``recent`` (newest activity first) or
        ``created`` (oldest first), filtered.

        Paging with ``next_cursor`` while other sessions are written never repeats or
        skips a session whose sort time did not change (a session written meanwhile moves
        to the front of ``recent``). Erased sessions are never listed.

        Args:
            owner: only this owner's sessions (exact).
            metadata: only sessions whose info metadata has each of these keys with this
                value (compared as JSON values).
            query: only sessions whose title contains this, case-insensitively (ASCII
                letters: the database's ``lower()``).
            status: ``idle``, ``streaming`` or ``error`` (the fold's status of sessions
                not closed), or ``closed``.
            order: ``"recent"`` (``updated_at`` newest first, ties by id) or ``"created"``
                (``created_at`` oldest first, ties by id).
            limit: the page size, 1..1000.
            cursor: a page's ``next_cursor``, with the same filters and order.
            include_lines: also list the lines kept by a rewind.

        Returns:
            A :class:`SessionPage`: ``items`` and ``next_cursor`` (``None`` on the last page).

        Raises:
            InvalidEvent: an argument is malformed, or ``cursor`` was not handed out by a
                listing with these filters (or was altered).
        """
        return catalogue.list_sessions(
            self._engine,
            owner=owner,
            metadata=metadata,
            query=query,
            status=status,
            order=order,
            limit=limit,
            cursor=cursor,
            include_lines=include_lines,
        )

    def diff(
        self, a: tuple[str, int | None], b: tuple[str, int | None], *, events: bool = False
    ) -> SessionDiff:
        """Compare two refs ``(session, version | None)``; see :func:`eventstore.features.timetravel.diff`."""
        return timetravel.diff(self._engine, a, b, events=events)

    def replay(
        self, session: str, *, after: int | None = None, upto: int | None = None
    ) -> Iterator[ReplayStep]:
        """Step through the fold event by event from the state at ``after`` up to ``upto``;
        see :func:`eventstore.features.timetravel.replay`."""
        return timetravel.replay(self._engine, session, after=after, upto=upto)

    def turns(self, session: str, *, upto: int | None = None) -> list[Turn]:
        """One row per turn; see :func:`eventstore.features.timetravel.turns`."""
        return timetravel.turns(self._engine, session, upto=upto)

    def export(
        self,
        session: str,
        out: str | os.PathLike[str] | IO[str],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Write a session as JSON Lines to a path or a text stream; see
        :func:`eventstore.features.exporting.export`."""
        return exporting.export(self._engine, session, out, progress=progress)

    def verify(
        self,
        session: str | None = None,
        *,
        checkpoint: Checkpoint | None = None,
        public_key: bytes | None = None,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> VerifyReport:
        """Check the hash chain, turns, baselines and every snapshot against the fold of its
        events (one session, or all) and, given a signed ``checkpoint`` and its
        ``public_key``, that the database still extends it; see :func:`eventstore.features.integrity.verify`."""
        return integrity.verify(
            self._engine, session, checkpoint=checkpoint, public_key=public_key, progress=progress
        )

    # -- audit --------------------------------------------------------------------------

    def checkpoint(self, private_key: bytes, *, origin: str | None = None) -> Checkpoint:
        """Sign every session's head (version, hash, baseline) with an Ed25519 key; see
        :func:`eventstore.features.audit.checkpoint`. Keep the result where the database's owners
        cannot rewrite it, and pass it to :meth:`verify` later."""
        return audit.checkpoint(self._engine, private_key, origin=origin)

    def erase(self, session: str, *, reason: str, actor: str | None = None) -> list[str]:
        """Erase a session and every branch forked from it, leaving tombstones; returns the
        erased ids. See :func:`eventstore.features.audit.erase`."""
        return audit.erase(self._engine, session, reason=reason, actor=actor)

    def erase_older_than(
        self,
        older_than: timedelta | str,
        *,
        reason: str,
        actor: str | None = None,
        dry_run: bool = False,
    ) -> list[str]:
        """Erase every session whose last event is older than ``older_than`` (``"90d"`` or a
        timedelta), with its branches; see :func:`eventstore.features.audit.erase_older_than`."""
        return audit.erase_older_than(self._engine, older_than, reason=reason, actor=actor, dry_run=dry_run)

    def report(
        self,
        session: str,
        version: int | None = None,
        *,
        against: tuple[str, int | None] | None = None,
        out: str | os.PathLike[str] | IO[str] | None = None,
        checkpoint: Checkpoint | None = None,
        public_key: bytes | None = None,
    ) -> str:
        """The audit report of a session as one self-contained HTML page; see
        :mod:`eventstore.features.report`.

        Args:
            session: the session to report on.
            version: render the session as it was at this version (``None``: the head).
            against: ``(session, version | None)``: render the diff from
                ``(session, version)`` to this ref instead.
            out: also write the page here: a path (written to ``PATH.part`` and renamed
                when complete) or a text file object.
            checkpoint: a signed checkpoint (with ``public_key``, the PEM public key it
                must be signed with) the page's verify result also checks the database
                still extends; the header says which one was used.

        Returns:
            The page.
        """
        return report.report(
            self._engine,
            session,
            version,
            against=against,
            out=out,
            checkpoint=checkpoint,
            public_key=public_key,
        )
