"""EventStore: the one module that joins storage, codec and reducer.

::

    with EventStore("sqlite:///chat.db") as store:
        store.migrate()
        store.append("s1", [{"type": "send", "id": "u-1", "text": "hi"}], expected_version=0)
        state = store.load("s1")              # head
        old = store.load("s1", version=0)     # any version
        alt = store.branch("s1", at=1)        # O(1) fork

How a version is loaded: resolve the session's *lineage* (itself, its parent up to the
fork version, and so on) as segments of versions per session; take the newest usable
snapshot inside them (made by this reducer version, or a compaction baseline); fold the
events after it with the trusted fast fold. Snapshots are written every
``snapshot_every`` versions in the transaction of the append that reaches them, so a
load folds fewer than ``snapshot_every`` events.

How an append is written: everything is validated and encoded first. Then, when this
process appended to the session last (it remembers the head row, hash included), the
*optimistic* path writes the events, moves the head only if it is still the remembered
one, and stores any snapshot due — on PostgreSQL as one statement in one round trip. If
the head had moved (another writer), or nothing is remembered, the *locked* path runs:
lock the session row (``SELECT … FOR UPDATE`` / ``BEGIN IMMEDIATE``), create the session
if needed, check event ids and ``expected_version``, insert, move the head, snapshot.
Either way a batch is atomic and appends to one session are serialised by its row.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import orjson

from .codec import (
    SnapshotCodec,
    chain_hash,
    recorded_hash,
    decode_many,
    decode_metadata,
    decode_payload,
    encode_action,
    encode_metadata,
)
from .errors import (
    CompactedError,
    ConcurrencyError,
    EventIdConflict,
    InvalidEvent,
    SchemaError,
    SessionExists,
    SessionNotFound,
    StorageError,
    VersionNotFound,
)
from .ids import check_new_session_id
from .models import SessionState, check_json, parse_actions
from .records import (
    AppendResult,
    CompactionRecord,
    RecordedEvent,
    SessionInfo,
    VerifyReport,
    to_datetime,
)
from .reducer import REDUCER_VERSION, fold_json
from .storage import (
    ZERO_HASH,
    EventRow,
    NewSession,
    Segment,
    SessionRow,
    SnapshotRow,
    Storage,
    open_storage,
)
from .storage.base import EventIdRace, LoadParts, Tx
from .storage.migrate import HEAD_REVISION

from typing import TYPE_CHECKING  # noqa: E402 - time travel's types, for the methods below

if TYPE_CHECKING:
    import os
    from typing import IO

    from .diff import SessionDiff
    from .timetravel import CompactResult, ImportResult, ReplayStep
    from .turns import Turn

__all__ = ["EventStore", "DEFAULT_SNAPSHOT_EVERY"]

#: Chosen from ``python -m benchmarks store`` (see benchmarks/RESULTS.md, "## Store").
DEFAULT_SNAPSHOT_EVERY = 128
_MAX_VERSION = 2**31 - 1  # versions are 32-bit integers in the schema

_HISTORY_CHUNK = 1000
_STATE_CACHE = 32
_HEADS_CACHE = 4096
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_KNOWN_BLOBS_MAX = 200_000  # ~20 MB of digests at most; forgetting only costs a re-send


#: A session head as the append path caches it: a state (``None``: the initial state) and
#: the action dicts recorded since, oldest first.
_Head = tuple["dict[str, Any] | None", list[dict[str, Any]]]


def _now_micros() -> int:
    return time.time_ns() // 1000


class EventStore:
    """Event-sourced chat sessions on SQLite or PostgreSQL.

    Args:
        url: a SQLAlchemy URL: ``sqlite:///path.db`` or ``postgresql+psycopg://user:pw@host/db``.
        snapshot_every: store the state every this many versions (a load then folds
            fewer events than this).
        max_event_bytes: the largest encoded action (and metadata) accepted.
        max_id_length: the longest session id, event id or actor accepted.
        **storage_options: backend options (``busy_timeout_ms`` for SQLite; ``pool_size``
            and ``ping_after_idle_s`` for PostgreSQL: the append fast path skips the
            connection pre-ping unless the pooled connection sat idle longer than this or
            looks dropped; default 0.5 s).

    The store opens no connection until first used. Use it as a context manager, or call
    :meth:`close`, to release its connections.

    Raises:
        StorageError: the URL is not a supported database URL.
        ValueError: ``snapshot_every`` or a limit is not positive.
    """

    def __init__(
        self,
        url: str,
        *,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        max_event_bytes: int = 1 << 20,
        max_id_length: int = 256,
        **storage_options: Any,
    ) -> None:
        if snapshot_every < 1 or max_event_bytes < 1 or max_id_length < 1:
            raise ValueError("snapshot_every, max_event_bytes and max_id_length must be positive")
        self.snapshot_every = snapshot_every
        self.max_event_bytes = max_event_bytes
        self.max_id_length = max_id_length
        self._storage: Storage = open_storage(url, **storage_options)
        self._codec = SnapshotCodec()
        # session pk -> (version, hash, head): the state this process last produced at a
        # session's head, so that a writer crossing a snapshot boundary folds only its own
        # batches. Keyed by the chain hash too, so another writer's append is never mistaken.
        self._states: OrderedDict[int, tuple[int, bytes, _Head]] = OrderedDict()
        # Digests known to be committed in snapshot_blobs (blobs are never deleted).
        self._known_blobs: set[bytes] = set()
        # session id -> its row as this process left it after its last append: the fast
        # path's guess of the head, verified by the write itself.
        self._heads: OrderedDict[str, SessionRow] = OrderedDict()

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL with any password masked."""
        return self._storage.safe_url

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._storage.dialect

    def close(self) -> None:
        """Release every database connection. The store must not be used afterwards."""
        self._storage.close()
        self._states.clear()
        self._heads.clear()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventStore({self.url!r}, snapshot_every={self.snapshot_every})"

    # -- schema -------------------------------------------------------------------------

    def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision (Alembic ``upgrade head``).

        Idempotent, and safe to run from several processes at once.

        Raises:
            StorageError: the database failed.
        """
        self._storage.migrate()

    def check_schema(self) -> None:
        """Make sure the database has this version's schema.

        Raises:
            SchemaError: the schema is missing or older; the message says to run
                ``eventstore migrate``.
        """
        rev = self._storage.schema_revision()
        if rev is None:
            raise SchemaError(
                f"the database {self.url} has no eventstore schema; run `eventstore migrate`"
            )
        if rev != HEAD_REVISION:
            raise SchemaError(
                f"the database {self.url} has eventstore schema revision {rev}, this version "
                f"needs {HEAD_REVISION}; run `eventstore migrate`"
            )

    # -- append -------------------------------------------------------------------------

    def append(
        self,
        session: str,
        actions: Iterable[Mapping[str, Any] | Any],
        expected_version: int | None = None,
        event_ids: Sequence[str] | None = None,
        actor: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> AppendResult:
        """Append a batch of actions to a session, atomically.

        The session is created by its first append. Every action is validated before
        anything is written; the batch then gets consecutive versions after the head, one
        recorded timestamp, turn numbers and hash-chain links.

        Args:
            session: the session id (1..``max_id_length`` characters, no control characters).
            actions: SPEC §1 action dicts or validated action models; at least one.
            expected_version: ``None`` for no check; ``0``: the session must not exist yet;
                ``n``: the head must be ``n``.
            event_ids: one id per action. Appending the same ids with the same content
                again returns the original result and writes nothing.
            actor: who is appending (recorded on every event of the batch).
            metadata: a JSON object recorded on every event of the batch.

        Returns:
            The :class:`AppendResult`; ``version`` is the new head.

        Raises:
            InvalidEvent: an action is malformed, too large, the batch is empty, an id is
                bad, or ``metadata`` is not a JSON object. Nothing was written.
            EventIdConflict: an event id is already recorded with other content.
            ConcurrencyError: the head is not ``expected_version``; nothing was written.
            SchemaError: the database is not migrated.
            StorageError: the database failed (``retryable`` tells whether to retry).
        """
        self._check_id(session, "session")
        if expected_version is not None and (
            not isinstance(expected_version, int)
            or isinstance(expected_version, bool)
            or expected_version < 0
        ):
            raise InvalidEvent(
                f"expected_version must be None or an integer >= 0, got {expected_version!r}",
                field="expected_version",
            )
        models = parse_actions(actions)
        if not models:
            raise InvalidEvent("an append needs at least one action")
        action_dicts = [m.to_json() for m in models]
        encoded = [encode_action(a) for a in action_dicts]
        for i, (_, payload) in enumerate(encoded):
            if len(payload) > self.max_event_bytes:
                raise InvalidEvent(
                    f"the action is {len(payload)} bytes encoded, more than max_event_bytes="
                    f"{self.max_event_bytes}",
                    index=i,
                )
        ids = self._check_event_ids(event_ids, len(models))
        if actor is not None:
            self._check_id(actor, "actor")
        if isinstance(metadata, Mapping):
            check_json(dict(metadata), "metadata")  # orjson would turn NaN into null
        meta = encode_metadata(metadata)
        if meta is not None and len(meta) > self.max_event_bytes:
            raise InvalidEvent(
                f"metadata is {len(meta)} bytes encoded, more than max_event_bytes="
                f"{self.max_event_bytes}",
                field="metadata",
            )
        try:
            return self._append(session, action_dicts, encoded, expected_version, ids, actor, meta)
        except EventIdRace:
            # One of our ids was already recorded (a retry on the optimistic path, or another
            # writer between our check and our insert): re-read under the lock and decide
            # between the original result and a conflict.
            return self._append(
                session, action_dicts, encoded, expected_version, ids, actor, meta, fast=False
            )

    def _append(
        self,
        session: str,
        action_dicts: list[dict[str, Any]],
        encoded: list[tuple[str, bytes]],
        expected: int | None,
        ids: tuple[str, ...] | None,
        actor: str | None,
        meta: bytes | None,
        fast: bool = True,
    ) -> AppendResult:
        st = self._storage
        now = _now_micros()
        # The head this process saw after its last append to the session, if any.
        known = self._heads.pop(session, None) if fast else None
        if known is not None and expected is not None and expected != known.head:
            known = None  # the caller expects another head: let the locked path decide
        if known is not None:
            # Optimistic path: the head check is part of the write, and so are the snapshots
            # this batch reaches (PostgreSQL: one statement, its own transaction).
            rows, prev, turn = self._rows(known, session, encoded, ids, actor, meta, now)
            head = rows[-1].version
            plan = self._plan(known, action_dicts, head, None)
            if plan is not None:
                snaps, blobs, state = plan
                if st.append_fast(known.pk, known.head, known.head_hash, rows, turn, snaps, blobs):
                    return self._appended(known, session, rows, prev, turn, state, blobs, ids, now)
        with st.write(session=session, expected=expected) as tx:
            row = st.lock_session(tx, session)
            if row is None:
                if expected not in (None, 0):
                    raise ConcurrencyError(session, expected, 0)
                check_new_session_id(session)
                row = st.insert_session(tx, NewSession(id=session, created_at=now))
                if row is None:  # created concurrently: wait for its lock
                    row = st.lock_session(tx, session)
                    assert row is not None
            if ids is not None:
                prior = st.events_by_id(tx, row.pk, ids)
                if prior:
                    return self._replayed(session, prior, ids, encoded, actor, meta)
            if expected is not None and row.head != expected:
                raise ConcurrencyError(session, expected, row.head)
            rows, prev, turn = self._rows(row, session, encoded, ids, actor, meta, now)
            head = rows[-1].version
            st.insert_events(tx, rows)
            st.set_head(tx, row.pk, head, prev, turn)
            plan = self._plan(row, action_dicts, head, tx)
            assert plan is not None
            snaps, blobs, state = plan
            for snap in snaps:
                st.put_snapshot(tx, snap, blobs if snap is snaps[0] else {})
        return self._appended(row, session, rows, prev, turn, state, blobs, ids, now)

    def _appended(
        self,
        row: SessionRow,
        session: str,
        rows: list[EventRow],
        prev: bytes,
        turn: int,
        state: _Head | None,
        blobs: Mapping[bytes, bytes],
        ids: tuple[str, ...] | None,
        now: int,
    ) -> AppendResult:
        """Bookkeeping after a committed append: caches, and the result."""
        head = rows[-1].version
        if state is not None:
            self._states[row.pk] = (head, prev, state)
            while len(self._states) > _STATE_CACHE:
                self._states.popitem(last=False)
        self._remember_blobs(set(blobs))
        # Not dataclasses.replace: this runs once per append and replace() is ~10x slower.
        self._heads[session] = SessionRow(
            row.pk,
            row.id,
            row.parent_pk,
            row.fork_version,
            head,
            prev,
            turn,
            row.baseline,
            row.baseline_hash,
            row.baseline_turn,
            row.created_at,
        )
        if len(self._heads) > _HEADS_CACHE:
            self._heads.popitem(last=False)
        return AppendResult(
            session=session,
            version=head,
            first_version=row.head + 1,
            count=len(rows),
            event_ids=ids,
            recorded_at=to_datetime(now),
        )

    @staticmethod
    def _rows(
        row: SessionRow,
        session: str,
        encoded: list[tuple[str, bytes]],
        ids: tuple[str, ...] | None,
        actor: str | None,
        meta: bytes | None,
        now: int,
    ) -> tuple[list[EventRow], bytes, int]:
        """The batch's event rows after ``row``'s head: versions, turns, chained hashes."""
        prev, turn = row.head_hash, row.head_turn
        rows: list[EventRow] = []
        for i, (type_, payload) in enumerate(encoded):
            version = row.head + 1 + i
            if type_ == "send":
                turn += 1
            event_id = None if ids is None else ids[i]
            prev = chain_hash(
                prev,
                session_id=session,
                version=version,
                event_id=event_id,
                type=type_,
                turn=turn,
                payload=payload,
                recorded_at=now,
                actor=actor,
                metadata=meta,
            )
            rows.append(
                EventRow(row.pk, version, event_id, type_, turn, payload, now, actor, meta, prev)
            )
        return rows, prev, turn

    def _replayed(
        self,
        session: str,
        prior: list[EventRow],
        ids: tuple[str, ...],
        encoded: list[tuple[str, bytes]],
        actor: str | None,
        meta: bytes | None,
    ) -> AppendResult:
        by_id = {e.event_id: e for e in prior}
        for event_id, (_, payload) in zip(ids, encoded):
            e = by_id.get(event_id)
            if e is not None and (e.payload != payload or e.actor != actor or e.metadata != meta):
                raise EventIdConflict(session, event_id, e.version)
        versions = [e.version for e in prior]
        if [e.event_id for e in prior] != list(ids) or versions != list(
            range(versions[0], versions[0] + len(ids))
        ):
            raise InvalidEvent(
                f"some of these event ids are already recorded in session {session!r} "
                f"(at versions {versions[0]}..{versions[-1]}) and some are not; "
                "send a retry with exactly the original batch",
                field="event_ids",
            )
        return AppendResult(
            session=session,
            version=versions[-1],
            first_version=versions[0],
            count=len(ids),
            event_ids=ids,
            recorded_at=to_datetime(prior[0].recorded_at),
            replayed=True,
        )

    def _plan(
        self,
        row: SessionRow,
        action_dicts: list[dict[str, Any]],
        head: int,
        tx: Tx | None,
    ) -> tuple[list[SnapshotRow], dict[bytes, bytes], _Head | None] | None:
        """The snapshots an append from ``row.head`` to ``head`` reaches, and the new head.

        The state at ``row.head`` comes from this process's cache (keyed by the chain hash,
        so another writer's append is never mistaken for ours) or, inside a transaction,
        from the database. Returns ``None`` when a snapshot is due but there is neither.

        The head is kept as a state plus the actions since it, folded only when a snapshot
        is due: folding one event into a state this fold does not own copies the path it
        changes, the list of every message included, so folding at each append would cost
        O(session) per event.

        Returns:
            ``(snapshots, new blobs they need, head or None)``.
        """
        n = self.snapshot_every
        start = row.head
        boundaries = list(range((start // n + 1) * n, head + 1, n))
        cached = self._states.pop(row.pk, None)
        base: dict[str, Any] | None
        if cached is not None and cached[0] == start and cached[1] == row.head_hash:
            base, pending = cached[2]
            pending.extend(action_dicts)
        elif start == 0:
            base, pending = None, list(action_dicts)  # a new session: the chain starts here
        elif not boundaries:
            return [], {}, None
        elif tx is None:
            return None
        else:
            # Re-read the row: a compaction elsewhere may have moved its baseline.
            fresh = self._storage.get_session(tx, row.id)
            base, pending = self._state_at(tx, fresh or row, start), list(action_dicts)
        snaps: list[SnapshotRow] = []
        blobs: dict[bytes, bytes] = {}
        if boundaries:
            known = self._known_blobs
            pos = head - len(pending)  # the version of ``base``
            for b in boundaries:
                base = fold_json(base, pending[: b - pos])
                del pending[: b - pos]
                pos = b
                rest, digests, bodies = self._codec.encode(base)
                snaps.append(SnapshotRow(row.pk, b, REDUCER_VERSION, rest, digests))
                blobs.update((d, body) for d, body in bodies.items() if d not in known)
        return snaps, blobs, (base, pending)

    def _put_snapshot(
        self, tx: Tx, session_pk: int, version: int, state: Mapping[str, Any], new_blobs: set[bytes]
    ) -> None:
        rest, digests, blobs = self._codec.encode(state)
        known = self._known_blobs
        fresh = {d: body for d, body in blobs.items() if d not in known}
        self._storage.put_snapshot(
            tx, SnapshotRow(session_pk, version, REDUCER_VERSION, rest, digests), fresh
        )
        new_blobs.update(fresh)

    def _remember_blobs(self, digests: set[bytes]) -> None:
        # Only after commit: a rolled-back blob must not be taken as present.
        if len(self._known_blobs) > _KNOWN_BLOBS_MAX:
            self._known_blobs.clear()
        self._known_blobs.update(digests)

    # -- reads --------------------------------------------------------------------------

    def head(self, session: str) -> int:
        """The newest version of a session.

        Raises:
            SessionNotFound: no such session.
        """
        with self._storage.read() as tx:
            return self._row(tx, session).head

    def load(self, session: str, version: int | None = None) -> SessionState:
        """The state of a session at a version.

        Args:
            session: the session id.
            version: ``None`` for the head; ``0`` for the initial state; else the state
                after that many events (a branch's versions ≤ its fork point are its
                parent's).

        Returns:
            The :class:`SessionState`.

        Raises:
            SessionNotFound: no such session.
            VersionNotFound: ``version`` is negative or beyond the head.
            CompactedError: ``version`` lies below the session's compaction baseline.
        """
        if version is None or (type(version) is int and 0 < version < 2**31):
            # One round trip for a root session (PostgreSQL); branches and backends
            # without the statement take the general path below.
            self._check_id(session, "session")
            parts = self._storage.load_parts(session, version, REDUCER_VERSION)
            if parts is not None:
                if parts.row is None:
                    raise SessionNotFound(session)
                v = self._check_version(parts.row, version)
                if parts.complete:
                    return SessionState.from_trusted(self._state_from_parts(parts, v))
        with self._storage.read() as tx:
            row = self._row(tx, session)
            v = self._check_version(row, version)
            state = self._state_at(tx, row, v)
        return SessionState.from_trusted(state)

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
            SessionNotFound: no such session.
        """
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        with self._storage.read() as tx:
            row = self._row(tx, session)
            lineage = self._lineage(tx, row)
        hi = row.head if upto is None else min(upto, row.head)
        lo = max(after or 0, row.baseline)
        names = {r.pk: r.id for r in lineage}
        segs = [
            Segment(s.session_pk, max(s.after, lo), s.upto)
            for s in _segments(lineage, hi)
            if s.upto > lo
        ]
        return self._iter_history(segs, names, limit, desc)

    def _iter_history(
        self, segs: list[Segment], names: dict[int, str], limit: int | None, desc: bool
    ) -> Iterator[RecordedEvent]:
        left = limit
        for seg in reversed(segs) if desc else segs:
            lo, hi = seg.after, seg.upto
            while lo < hi and (left is None or left > 0):
                size = _HISTORY_CHUNK if left is None else min(left, _HISTORY_CHUNK)
                with self._storage.read() as tx:
                    rows = self._storage.read_events(
                        tx, seg.session_pk, after=lo, upto=hi, limit=size, desc=desc
                    )
                if not rows:
                    break
                for e in rows:
                    yield _recorded(e, names[e.session_pk])
                if left is not None:
                    left -= len(rows)
                if desc:
                    hi = rows[-1].version - 1
                else:
                    lo = rows[-1].version
                if len(rows) < size:
                    break

    def sessions(self) -> list[SessionInfo]:
        """Every session (roots and branches), oldest first.

        Returns:
            One :class:`SessionInfo` per session.
        """
        with self._storage.read() as tx:
            rows = self._storage.list_sessions(tx)
        names = {r.pk: r.id for r in rows}
        return [
            SessionInfo(
                id=r.id,
                parent=None if r.parent_pk is None else names.get(r.parent_pk),
                fork_version=r.fork_version,
                head=r.head,
                baseline=r.baseline,
                created_at=to_datetime(r.created_at),
                head_turn=r.head_turn,
            )
            for r in rows
        ]

    # -- branch -------------------------------------------------------------------------

    def branch(self, session: str, at: int | None = None, new_id: str | None = None) -> str:
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
            SessionNotFound: no such session.
            SessionExists: ``new_id`` is taken.
            VersionNotFound: ``at`` is negative or beyond the head.
            CompactedError: ``at`` lies below the session's baseline.
            InvalidEvent: ``new_id`` is not a valid id.
        """
        if new_id is None:
            new_id = f"{session}-{uuid.uuid4().hex[:8]}"
        self._check_id(new_id, "new_id")
        check_new_session_id(new_id, "new_id")
        self._check_id(session, "session")
        st = self._storage
        with st.write() as tx:
            row = st.lock_session(tx, session)
            if row is None:
                raise SessionNotFound(session)
            v = self._check_version(row, at)
            h, turn = self._hash_turn_at(tx, row, v)
            new = NewSession(
                id=new_id,
                created_at=_now_micros(),
                parent_pk=row.pk,
                fork_version=v,
                head=v,
                head_hash=h,
                head_turn=turn,
                # What the parent compacted away is gone for the branch too.
                baseline=row.baseline,
                baseline_hash=row.baseline_hash,
                baseline_turn=row.baseline_turn,
            )
            if st.insert_session(tx, new) is None:
                raise SessionExists(new_id)
        return new_id

    # -- compaction primitive -----------------------------------------------------------

    def _compact_storage(self, session: str, upto: int) -> CompactionRecord:
        """Make the state at ``upto`` the session's baseline and delete what it replaces.

        One transaction: the baseline snapshot is written first, then ``sessions.baseline``
        moves, then the session's own events ``1..upto`` are deleted under a compaction
        permit — except those a branch forked from this session still reads (at or below
        its fork version). Loading below ``upto`` then raises :class:`CompactedError`;
        every version at or above it loads exactly as before, and so does every branch.

        Args:
            session: the session to compact.
            upto: the new baseline (``baseline <= upto <= head``).

        Returns:
            A :class:`CompactionRecord` (a no-op when ``upto`` is the current baseline).

        Raises:
            SessionNotFound, VersionNotFound, CompactedError: as for :meth:`load`.
        """
        self._check_id(session, "session")
        st = self._storage
        new_blobs: set[bytes] = set()
        with st.write() as tx:
            row = st.lock_session(tx, session)
            if row is None:
                raise SessionNotFound(session)
            v = self._check_version(row, upto)
            keep = st.max_child_fork(tx, row.pk)
            if v == row.baseline:
                return CompactionRecord(session, v, row.baseline, 0, keep)
            state = self._state_at(tx, row, v)
            # The snapshot first: it is what keeps the state after the delete.
            self._put_snapshot(tx, row.pk, v, state, new_blobs)
            h, turn = self._hash_turn_at(tx, row, v)
            deleted = st.compact(
                tx,
                row.pk,
                upto=v,
                keep_upto=max(keep or 0, row.fork_version or 0),
                baseline_hash=h,
                baseline_turn=turn,
            )
        self._remember_blobs(new_blobs)
        return CompactionRecord(session, v, row.baseline, deleted, keep)

    # -- time travel (implemented in eventstore/timetravel.py) ---------------------------

    def diff(
        self, a: tuple[str, int | None], b: tuple[str, int | None], *, events: bool = False
    ) -> SessionDiff:
        """Compare two refs ``(session, version | None)``; see :func:`eventstore.timetravel.diff`."""
        from .timetravel import diff

        return diff(self, a, b, events=events)

    def replay(
        self, session: str, *, start: int | None = None, stop: int | None = None
    ) -> Iterator[ReplayStep]:
        """Step through the fold event by event; see :func:`eventstore.timetravel.replay`."""
        from .timetravel import replay

        return replay(self, session, start=start, stop=stop)

    def turns(self, session: str, *, upto: int | None = None) -> list[Turn]:
        """One row per turn; see :func:`eventstore.timetravel.turns`."""
        from .timetravel import turns

        return turns(self, session, upto=upto)

    def compact(
        self,
        session: str,
        upto: int,
        archive: str | os.PathLike[str] | IO[str] | None = None,
    ) -> CompactResult:
        """Fold events ``1..upto`` into a baseline; see :func:`eventstore.timetravel.compact`."""
        from .timetravel import compact

        return compact(self, session, upto, archive)

    def compact_all(self, *, keep_last_turns: int, progress: Any = None) -> list[CompactResult]:
        """Compact every session keeping its last N turns; see :func:`eventstore.timetravel.compact_all`."""
        from .timetravel import compact_all

        return compact_all(self, keep_last_turns=keep_last_turns, progress=progress)

    def export(self, session: str, out: IO[str], *, progress: Any = None) -> int:
        """Write a session as JSON Lines; see :func:`eventstore.timetravel.export`."""
        from .timetravel import export

        return export(self, session, out, progress=progress)

    def import_(self, src: IO[str] | Iterable[str], *, progress: Any = None) -> list[ImportResult]:
        """Recreate sessions from an export file; see :func:`eventstore.timetravel.import_`."""
        from .timetravel import import_

        return import_(self, src, progress=progress)

    # -- verify -------------------------------------------------------------------------

    def verify(self, session: str | None = None) -> VerifyReport:
        """Check integrity: the hash chain and that snapshots equal the fold of their events.

        For each session, the chain is recomputed over its whole lineage (the inherited
        prefix included; from the baseline hash after a compaction), versions must be
        contiguous up to the head, and every snapshot made by this reducer version must
        equal the fold of the events it stands for.

        Args:
            session: one session; ``None`` checks every session.

        Returns:
            A :class:`VerifyReport`; each problem names the session and the version.

        Raises:
            SessionNotFound: ``session`` does not exist.
        """
        with self._storage.read() as tx:
            if session is None:
                rows = self._storage.list_sessions(tx)
            else:
                rows = [self._row(tx, session)]
        problems: list[str] = []
        n_events = n_snaps = 0
        for row in rows:
            e, s = self._verify_one(row, problems)
            n_events += e
            n_snaps += s
        return VerifyReport(
            ok=not problems,
            problems=problems,
            sessions=[r.id for r in rows],
            events=n_events,
            snapshots=n_snaps,
        )

    def _verify_one(self, row: SessionRow, problems: list[str]) -> tuple[int, int]:
        st = self._storage
        checked = n_snaps = 0
        with st.read() as tx:
            lineage = self._lineage(tx, row)
            names = {r.pk: r.id for r in lineage}
            segs = _segments(lineage, row.head)
            start = row.baseline
            prev = row.baseline_hash or ZERO_HASH if start else ZERO_HASH
            state: dict[str, Any] | None = None
            if start:
                state = self._state_at(tx, row, start)
            # Snapshots this session can be served, by version (baselines stand for
            # deleted events and cannot be checked against them).
            snaps: dict[int, SnapshotRow] = {}
            for seg in segs:
                for s in st.list_snapshots(
                    tx, seg.session_pk, after=max(seg.after, start), upto=seg.upto
                ):
                    if s.reducer_version == REDUCER_VERSION:
                        snaps[s.version] = s
            expected = start + 1
            pending: list[dict[str, Any]] = []
            for seg in segs:
                lo = max(seg.after, start)
                while lo < seg.upto:
                    rows = st.read_events(
                        tx, seg.session_pk, after=lo, upto=seg.upto, limit=_HISTORY_CHUNK
                    )
                    if not rows:
                        break
                    for e in rows:
                        who = names[e.session_pk]
                        where = f"session {who!r} version {e.version}"
                        if who != row.id:
                            where += f" (inherited by {row.id!r})"
                        if e.version != expected:
                            problems.append(
                                f"{where}: versions {expected}..{e.version - 1} are missing"
                            )
                        expected = e.version + 1
                        h = recorded_hash(prev, who, e)
                        if h != e.hash:
                            problems.append(
                                f"{where}: hash mismatch (the event or its chain was altered)"
                            )
                        prev = e.hash
                        checked += 1
                        try:
                            pending.append(decode_payload(e.payload))
                        except Exception:  # noqa: BLE001 - a corrupt payload is a finding
                            problems.append(f"{where}: payload is not valid JSON")
                            pending.append({"type": "stop"})
                        snap = snaps.get(e.version)
                        if snap is not None:
                            state = fold_json(state, pending)
                            pending = []
                            n_snaps += 1
                            if self._decode_snapshot(tx, snap) != state:
                                problems.append(
                                    f"session {names[snap.session_pk]!r} version {snap.version}: "
                                    "snapshot differs from the fold of its events"
                                )
                    lo = rows[-1].version
            if expected != row.head + 1:
                problems.append(
                    f"session {row.id!r} version {expected}: events {expected}..{row.head} "
                    "are missing"
                )
            elif row.head > start and prev != row.head_hash:
                problems.append(
                    f"session {row.id!r} version {row.head}: head hash does not match the chain"
                )
            # INSERT is allowed to the application, so rows can be forged past the head too;
            # they are outside the chain walked above and would block the next append.
            beyond = st.read_events(tx, row.pk, after=row.head, upto=_MAX_VERSION, limit=1)
            if beyond:
                problems.append(
                    f"session {row.id!r} version {beyond[0].version}: event rows beyond the "
                    f"head ({row.head}) were written behind the library's back"
                )
        return checked, n_snaps

    # -- internals ----------------------------------------------------------------------

    def _row(self, tx: Tx, session: str) -> SessionRow:
        # A hostile id (NUL, wrong type, surrogate) is refused here, not by the driver.
        self._check_id(session, "session")
        row = self._storage.get_session(tx, session)
        if row is None:
            raise SessionNotFound(session)
        return row

    def _check_id(self, value: Any, what: str) -> None:
        if not isinstance(value, str) or not value:
            raise InvalidEvent(f"{what} must be a non-empty string, got {value!r}", field=what)
        if len(value) > self.max_id_length:
            raise InvalidEvent(
                f"{what} is {len(value)} characters long, more than max_id_length="
                f"{self.max_id_length}",
                field=what,
            )
        if _CONTROL.search(value):
            raise InvalidEvent(f"{what} must not contain control characters", field=what)
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidEvent(
                    f"{what} contains a lone surrogate (not valid Unicode text)", field=what
                ) from None
        # Ids are indexed: PostgreSQL's btree refuses entries over ~2.7 kB whatever
        # max_id_length says, so cap the UTF-8 size too (an InvalidEvent, not a driver error).
        if len(value) > 512 and len(value.encode("utf-8")) > 2048:
            raise InvalidEvent(f"{what} is more than 2048 bytes of UTF-8 (ids are indexed)", field=what)

    def _check_event_ids(self, event_ids: Sequence[str] | None, n: int) -> tuple[str, ...] | None:
        if event_ids is None:
            return None
        if isinstance(event_ids, (str, bytes)):
            raise InvalidEvent(
                "event_ids must be a list of strings, one per action", field="event_ids"
            )
        ids = tuple(event_ids)
        if len(ids) != n:
            raise InvalidEvent(
                f"event_ids has {len(ids)} ids for {n} actions; give one per action",
                field="event_ids",
            )
        for i, event_id in enumerate(ids):
            try:
                self._check_id(event_id, "event_ids")
            except InvalidEvent as exc:
                raise InvalidEvent(exc.reason, field="event_ids", index=i) from None
        if len(set(ids)) != len(ids):
            raise InvalidEvent("event_ids repeats an id within the batch", field="event_ids")
        return ids

    def _check_version(self, row: SessionRow, version: int | None) -> int:
        if version is None:
            return row.head
        if not isinstance(version, int) or isinstance(version, bool):
            raise VersionNotFound(row.id, version, row.head)
        if version < 0 or version > row.head:
            raise VersionNotFound(row.id, version, row.head)
        if version < row.baseline:
            raise CompactedError(row.id, version, row.baseline, row.head)
        return version

    def _lineage(self, tx: Tx, row: SessionRow) -> list[SessionRow]:
        chain = [row]
        while chain[-1].parent_pk is not None:
            chain.append(self._storage.get_session_by_pk(tx, chain[-1].parent_pk))
        chain.reverse()
        return chain

    def _state_at(self, tx: Tx, row: SessionRow, version: int) -> dict[str, Any]:
        """The state dict after ``version`` (already validated against ``row``)."""
        if version == 0:
            return fold_json(None, ())
        st = self._storage
        lineage = self._lineage(tx, row) if row.parent_pk is not None else [row]
        segs = _segments(lineage, version)
        # A compaction baseline snapshot (r, b) is r's state at b. It is this version's
        # history too only when b is within what this version reads of r (b <= r's cap):
        # a branch forked below its parent's later baseline must never be served it.
        caps = _caps(lineage, version)
        baselines = [(r.pk, r.baseline) for r in lineage if 0 < r.baseline <= caps[r.pk]]
        snap = st.latest_snapshot(tx, segs, REDUCER_VERSION, baselines)
        base = 0
        state: dict[str, Any] | None = None
        if snap is not None:
            base = snap.version
            state = self._decode_snapshot(tx, snap)
        payloads: list[bytes] = []
        for seg in segs:
            if seg.upto > base:
                payloads += st.read_payloads(
                    tx, seg.session_pk, after=max(seg.after, base), upto=seg.upto
                )
        if len(payloads) != version - base:
            raise StorageError(
                f"session {row.id!r}: events {base + 1}..{version} are incomplete "
                f"({len(payloads)} of {version - base} found); run `eventstore verify`"
            )
        return fold_json(state, decode_many(payloads))

    def _decode_snapshot(self, tx: Tx, snap: SnapshotRow) -> dict[str, Any]:
        ordered = self._storage.ordered_bodies(tx, snap.message_digests)
        if None in ordered:
            raise StorageError(
                f"snapshot at version {snap.version} refers to a missing message blob; "
                "run `eventstore verify`"
            )
        return self._codec.decode(snap.rest, ordered)  # type: ignore[arg-type]

    def _state_from_parts(self, parts: LoadParts, version: int) -> dict[str, Any]:
        """The state dict at ``version`` from a one-statement read (:meth:`Storage.load_parts`)."""
        base = parts.snap_version
        state: dict[str, Any] | None = None
        if parts.rest is not None:
            if parts.n_found != parts.n_digests:
                raise StorageError(
                    f"snapshot at version {base} refers to a missing message blob; "
                    "run `eventstore verify`"
                )
            state = self._codec.decode_joined(parts.rest, parts.messages)
        if parts.n_tail != version - base:
            assert parts.row is not None
            raise StorageError(
                f"session {parts.row.id!r}: events {base + 1}..{version} are incomplete "
                f"({parts.n_tail} of {version - base} found); run `eventstore verify`"
            )
        actions = orjson.loads(b"[" + parts.tail + b"]") if parts.n_tail else []
        return fold_json(state, actions)

    def _hash_turn_at(self, tx: Tx, row: SessionRow, version: int) -> tuple[bytes, int]:
        """The chain hash and turn number at a version of a session's lineage."""
        if version == 0:
            return ZERO_HASH, 0
        if version == row.head:
            return row.head_hash, row.head_turn
        if version == row.baseline and row.baseline_hash is not None:
            return row.baseline_hash, row.baseline_turn
        lineage = self._lineage(tx, row)
        for seg in _segments(lineage, version):
            if seg.after < version <= seg.upto:
                e = self._storage.event_at(tx, seg.session_pk, version)
                if e is not None:
                    return e.hash, e.turn
                owner = next(r for r in lineage if r.pk == seg.session_pk)
                if owner.baseline == version and owner.baseline_hash is not None:
                    return owner.baseline_hash, owner.baseline_turn
        raise CompactedError(row.id, version, row.baseline, row.head)


def _segments(lineage: list[SessionRow], version: int) -> list[Segment]:
    """Where versions ``1..version`` of the last session of ``lineage`` live, root first."""
    segs: list[Segment] = []
    cap = version
    for r in reversed(lineage):
        after = r.fork_version or 0
        if cap > after:
            segs.append(Segment(r.pk, after, cap))
        cap = min(cap, after)
        if cap == 0:
            break
    segs.reverse()
    return segs


def _caps(lineage: list[SessionRow], version: int) -> dict[int, int]:
    """For each session of ``lineage``: the highest version of it that ``version`` reads."""
    caps: dict[int, int] = {}
    cap = version
    for r in reversed(lineage):
        caps[r.pk] = cap
        cap = min(cap, r.fork_version or 0)
    return caps


def _recorded(e: EventRow, session_id: str) -> RecordedEvent:
    return RecordedEvent(
        session_id=session_id,
        version=e.version,
        event_id=e.event_id,
        type=e.type,
        action=decode_payload(e.payload),
        turn=e.turn,
        recorded_at=to_datetime(e.recorded_at),
        actor=e.actor,
        metadata=decode_metadata(e.metadata),
        hash=e.hash.hex(),
    )
