"""The engine: everything between the public API and storage, in one place.

:class:`Engine` validates arguments (:mod:`eventstore.core.validation`), resolves session rows and
lineages, computes states at versions, plans and writes snapshots, and holds the
compaction primitive and the hash lookups. Its logic lives in :mod:`eventstore.core.appends`
(pure functions over rows); this class adds only the synchronous storage calls around it.
:class:`~eventstore.store.EventStore` is a thin facade over it, and the feature modules
(:mod:`~eventstore.features.timetravel`, :mod:`~eventstore.features.compaction`, :mod:`~eventstore.features.transfer`,
:mod:`~eventstore.features.verify`) take an engine, never the facade.

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

The asyncio twin (:class:`~eventstore.async_store.AsyncEventStore`) runs this very class:
its storage is opened on the asyncio drivers and each call runs in a greenlet
(:mod:`eventstore.engine.async_bridge`), where every storage call awaits on the event loop. So nothing here
may block on anything but a storage call, and the planner's lock is held only around dict
operations, never across a storage call.

Threads: one engine may be shared by any number of threads. Storage hands each thread its
own connection; the only shared mutable state is the :class:`~eventstore.core.appends.AppendPlanner`
caches, which are taken and put back under a lock (see there).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from eventstore.core.appends import (
    State,
    baselines,
    check_version,
    event_rows,
    fold_tail,
    head_after,
    history_segments,
    known_hash_turn,
    missing_blob,
    recorded,
    recorded_from_feed,
    replayed,
    segments,
    state_from_parts,
)
from eventstore.core.segments import SegmentCodec
from eventstore.core.codec import decode_many, encode_action, encode_metadata, state_digest
from eventstore.core.feed_rules import (
    FEED_CHUNK,
    Bands,
    FeedKey,
    Follower,
    FollowState,
    Live,
    Pacer,
    wait_arg,
)
from eventstore.core.catalogue import absolute_effect, catalogue_fields, state_catalogue
from eventstore.core.catalogue import effect as catalogue_effect
from eventstore.core.ids import check_new_session_id
from eventstore.core.models import check_json, parse_actions
from eventstore.core.records import (
    AppendResult,
    CompactionRecord,
    RecordedEvent,
    SessionInfo,
    to_datetime,
)
from eventstore.core.reducer import REDUCER_VERSION, fold_json
from eventstore.core.rewinds import Rewinds
from eventstore.core.rows import (
    CatalogueEffect,
    CompactionRow,
    EventRow,
    NewSession,
    Segment,
    SessionControl,
    SessionRow,
    SnapshotRow,
    TurnBatch,
)
from eventstore.core.turn_rules import session_info
from eventstore.core.validation import MAX_VERSION, Limits, Validator
from eventstore.engine.planner import AppendPlan, AppendPlanner
from eventstore.errors import (
    CompactedError,
    ConcurrencyError,
    InvalidEvent,
    SchemaError,
    SessionClosed,
    SessionErased,
    SessionExists,
    SessionNotFound,
    SessionRewound,
    StorageError,
    VersionNotFound,
)
from eventstore.storage import Storage, open_storage
from eventstore.storage import catalogue as catalogue_rows
from eventstore.engine.sealer import Sealer
from eventstore.storage.interface import EventIdRace, Tx
from eventstore.storage.migrate import HEAD_REVISION

__all__ = ["Engine", "Tx", "AppendRequest", "PlannedAppend", "DEFAULT_SNAPSHOT_EVERY", "HISTORY_CHUNK", "now_micros"]

#: Chosen from ``python -m benchmarks store`` (see benchmarks/RESULTS.md, "## Store").
DEFAULT_SNAPSHOT_EVERY = 128
#: Events read per query when a history is iterated.
HISTORY_CHUNK = 1000


def now_micros() -> int:
    """Microseconds since the Unix epoch, now (the one clock of the engine)."""
    return time.time_ns() // 1000


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """An append's arguments, validated and encoded (:meth:`Engine.prepare_append`).

    Attributes:
        session: the session id.
        action_dicts: the actions as JSON-shaped dicts.
        encoded: ``(type, payload bytes)`` of each action.
        expected: the caller's ``expected_version``, or ``None``.
        ids: the caller's event ids, or ``None``.
        actor: who appends, or ``None``.
        meta: the encoded metadata, or ``None``.
        natives: each action's provider-native bytes (``None`` for none), or ``None``.
    """

    session: str
    action_dicts: list[dict[str, Any]]
    encoded: list[tuple[str, bytes]]
    expected: int | None
    ids: tuple[str, ...] | None
    actor: str | None
    meta: bytes | None
    natives: tuple[bytes | None, ...] | None = None


@dataclass(frozen=True, slots=True)
class PlannedAppend:
    """What an append writes after a known head: its rows, the new head and snapshots.

    Attributes:
        request: the append.
        row: the session row it was planned on (its head is the one the write checks).
        rows: the event rows, hashes chained from ``row``'s head.
        prev: the new head hash.
        turn: the new head turn.
        plan: the snapshots it reaches and the state to cache after the commit.
        now: its ``recorded_at`` (microseconds).
    """

    request: AppendRequest
    row: SessionRow
    rows: list[EventRow]
    prev: bytes
    turn: int
    plan: AppendPlan
    now: int

    def batch(self) -> TurnBatch:
        """The conditional write of a group commit: no turn's lease is checked or changed."""
        return TurnBatch(
            self.row.pk,
            self.row.head,
            self.row.head_hash,
            None,
            self.now,
            self.rows,
            self.turn,
            self.plan.snapshots,
            self.plan.blobs,
            effect=self.effect(),
        )

    def effect(self) -> CatalogueEffect:
        """What the append does to its session's catalogue columns."""
        return catalogue_effect(self.request.action_dicts, self.now)


class Engine:
    """Storage, the validator and the append planner, with the sync calls that join them.

    Attributes:
        storage: the database (rows of ids, integers and bytes).
        validate: the argument validator every entry point uses.
        planner: snapshot planning and the per-process caches.
        snapshot_every: store the state every this many versions.
    """

    def __init__(
        self,
        url: Any,
        *,
        snapshot_every: Any = DEFAULT_SNAPSHOT_EVERY,
        max_event_bytes: Any = 1 << 20,
        max_id_length: Any = 256,
        seal: Any = True,
        **storage_options: Any,
    ) -> None:
        if type(seal) is not bool:
            raise InvalidEvent(f"seal must be True or False, got {seal!r}", field="seal")
        for name, value in (
            ("snapshot_every", snapshot_every),
            ("max_event_bytes", max_event_bytes),
            ("max_id_length", max_id_length),
        ):
            if type(value) is not int or value < 1:
                raise InvalidEvent(f"{name} must be a positive integer, got {value!r}", field=name)
        if not isinstance(url, str):
            raise InvalidEvent(f"url must be a string, got {type(url).__name__}", field="url")
        self.snapshot_every: int = snapshot_every
        self.validate = Validator(Limits(max_event_bytes, max_id_length))
        self.planner = AppendPlanner(snapshot_every)
        self.storage: Storage = open_storage(url, **storage_options)
        self.storage.use_segments(SegmentCodec())
        #: Whether closed turns are sealed in the background (``seal=``).
        self.seal_enabled = seal
        # A worker thread needs a storage of its own thread: not the asyncio one.
        self.sealer = Sealer(self, background=seal and not storage_options.get("use_asyncio", False))
        if self.sealer.background:
            self.planner.on_new_turn = self.sealer.wake

    # -- lifecycle and schema -----------------------------------------------------------

    def close(self) -> None:
        """Release every connection and forget the caches."""
        self.sealer.close()
        self.storage.close()
        self.planner.clear()

    def seal(self, session: Any = None) -> int:
        """Seal every closed turn now (of one session, or of all); how many were sealed."""
        if session is None:
            return self.sealer.seal(None)
        return self.sealer.seal(self.session_row(session).pk)

    def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision."""
        self.storage.migrate()

    def check_schema(self) -> None:
        """Raise :class:`SchemaError` unless the database has this version's schema."""
        rev = self.storage.schema_revision()
        url = self.storage.safe_url
        if rev is None:
            raise SchemaError(f"the database {url} has no eventstore schema; run `eventstore migrate`")
        if rev != HEAD_REVISION:
            raise SchemaError(
                f"the database {url} has eventstore schema revision {rev}, this version "
                f"needs {HEAD_REVISION}; run `eventstore migrate`"
            )

    # -- rows and lineage ---------------------------------------------------------------

    def row(self, tx: Tx, session: Any) -> SessionRow:
        """The row of a session (its id validated first).

        Raises:
            InvalidEvent: the id is not valid.
            SessionNotFound: there is no such session.
        """
        self.validate.id(session, "session")
        row = self.storage.get_session(tx, session)
        if row is None:
            raise self.missing(tx, session)
        return row

    def missing(self, tx: Tx, session: str) -> SessionNotFound | SessionErased:
        """The error for a session id with no row: :class:`SessionErased` when a tombstone
        says it was erased, else :class:`SessionNotFound`."""
        mark = self.storage.get_tombstone(tx, session)
        if mark is None:
            return SessionNotFound(session)
        return SessionErased(session, erased_at=mark.erased_at, actor=mark.actor, reason=mark.reason)

    def insert_new_session(self, tx: Tx, new: NewSession) -> SessionRow | None:
        """Insert a session row; ``None`` when the id is taken.

        Raises:
            SessionErased: the id belonged to an erased session (ids are never reused, so a
                tombstone always names one session's history).
        """
        if self.storage.get_tombstone(tx, new.id) is not None:
            raise self.missing(tx, new.id)
        return self.storage.insert_session(tx, new)

    def session_row(self, session: Any) -> SessionRow:
        """:meth:`row` in a read transaction of its own."""
        with self.storage.read() as tx:
            return self.row(tx, session)

    def lineage(self, tx: Tx, row: SessionRow) -> list[SessionRow]:
        """``row`` and the sessions it descends from, root first."""
        chain = [row]
        while chain[-1].parent_pk is not None:
            chain.append(self.storage.get_session_by_pk(tx, chain[-1].parent_pk))
        chain.reverse()
        return chain

    def hash_turn_at(self, tx: Tx, row: SessionRow, version: int) -> tuple[bytes, int]:
        """The chain hash and turn number at a version of a session's lineage.

        Raises:
            CompactedError: the event at that version is gone.
        """
        known = known_hash_turn(row, version)
        if known is not None:
            return known
        lineage = self.lineage(tx, row)
        for seg in segments(lineage, version):
            if seg.after < version <= seg.upto:
                e = self.storage.event_at(tx, seg.session_pk, version)
                if e is not None:
                    return e.hash, e.turn
                owner = next(r for r in lineage if r.pk == seg.session_pk)
                if owner.baseline == version and owner.baseline_hash is not None:
                    return owner.baseline_hash, owner.baseline_turn
        raise CompactedError(row.id, version, row.baseline, row.head)

    # -- states -------------------------------------------------------------------------

    def state_at(self, tx: Tx, row: SessionRow, version: int) -> State:
        """The state dict after ``version`` (already checked against ``row``)."""
        if version == 0:
            return fold_json(None, ())
        st = self.storage
        lineage = self.lineage(tx, row) if row.parent_pk is not None else [row]
        segs = segments(lineage, version)
        snap = st.latest_snapshot(tx, segs, REDUCER_VERSION, baselines(lineage, version))
        base = 0
        state: State | None = None
        if snap is not None:
            base = snap.version
            state = self.decode_snapshot(tx, snap)
        payloads: list[bytes] = []
        for seg in segs:
            if seg.upto > base:
                payloads += st.read_payloads(tx, seg.session_pk, after=max(seg.after, base), upto=seg.upto)
        return fold_tail(row.id, base, version, state, decode_many(payloads))

    def decode_snapshot(self, tx: Tx, snap: SnapshotRow) -> State:
        """The state a snapshot row stands for."""
        ordered = self.storage.ordered_bodies(tx, snap.message_digests)
        if None in ordered:
            raise missing_blob(snap.version)
        return self.planner.codec.decode(snap.rest, ordered)  # type: ignore[arg-type]

    def load(self, session: Any, version: Any = None) -> State:
        """The state dict of a session at a version (``None``: the head)."""
        self.validate.id(session, "session")
        self.validate.version(version)
        if version is None or 0 < version <= MAX_VERSION:
            # One round trip for a root session (PostgreSQL); branches and backends
            # without the statement take the general path below.
            parts = self.storage.load_parts(session, version, REDUCER_VERSION)
            if parts is not None:
                if parts.row is None:
                    with self.storage.read() as tx:
                        raise self.missing(tx, session)
                v = check_version(parts.row, version)
                if parts.complete:
                    return state_from_parts(parts, v)
        with self.storage.read() as tx:
            row = self.row(tx, session)
            return self.state_at(tx, row, check_version(row, version))

    def put_snapshot(self, tx: Tx, pk: int, version: int, state: Mapping[str, Any], written: set[bytes]) -> None:
        """Store ``state`` as the snapshot of session ``pk`` at ``version``; add the blobs
        written to ``written``, so that later snapshots of the same transaction skip them."""
        snap, fresh = self.planner.snapshot(pk, version, state)
        fresh = {d: body for d, body in fresh.items() if d not in written}
        self.storage.put_snapshot(tx, snap, fresh)
        written.update(fresh)

    # -- append -------------------------------------------------------------------------

    def prepare_append(
        self,
        session: Any,
        actions: Any,
        *,
        expected_version: Any = None,
        event_ids: Any = None,
        actor: Any = None,
        metadata: Any = None,
        native: Any = None,
    ) -> AppendRequest:
        """Validate and encode the arguments of an append (no I/O).

        Raises:
            InvalidEvent: an argument is malformed (see :meth:`eventstore.EventStore.append`).
        """
        v = self.validate
        v.id(session, "session")
        v.count(expected_version, "expected_version")
        if actions is None or isinstance(actions, (str, bytes, Mapping)) or not isinstance(actions, Iterable):
            raise InvalidEvent("actions must be a list of actions", field="actions")
        models = parse_actions(actions, max_bytes=v.limits.max_event_bytes)
        if not models:
            raise InvalidEvent("an append needs at least one action")
        action_dicts = [m.to_json() for m in models]
        encoded = [encode_action(a) for a in action_dicts]
        for i, (_, payload) in enumerate(encoded):
            v.size(payload, "the action", index=i)
        ids = v.event_ids(event_ids, len(models))
        v.optional_id(actor, "actor")
        if isinstance(metadata, Mapping):
            # orjson would turn NaN into null; and a huge value is refused before it encodes
            check_json(dict(metadata), "metadata", max_bytes=v.limits.max_event_bytes, what="metadata")
        meta = encode_metadata(metadata)
        if meta is not None:
            v.size(meta, "metadata", field="metadata")
        natives = v.natives(native, len(models))
        return AppendRequest(
            session, action_dicts, encoded, expected_version, ids, actor, meta, natives
        )

    def append(
        self,
        session: Any,
        actions: Any,
        *,
        expected_version: Any = None,
        event_ids: Any = None,
        actor: Any = None,
        metadata: Any = None,
        native: Any = None,
    ) -> AppendResult:
        """Validate and append a batch (see :meth:`eventstore.EventStore.append`)."""
        return self.append_request(
            self.prepare_append(
                session,
                actions,
                expected_version=expected_version,
                event_ids=event_ids,
                actor=actor,
                metadata=metadata,
                native=native,
            )
        )

    def append_request(self, req: AppendRequest) -> AppendResult:
        """Append a prepared batch: the optimistic path, else the locked one."""
        try:
            return self._append(req, True)
        except EventIdRace:
            # One of our ids was already recorded (a retry on the optimistic path, or another
            # writer between our check and our insert): re-read under the lock and decide
            # between the original result and a conflict.
            return self._append(req, False)

    def plan_optimistic(self, req: AppendRequest, now: int) -> PlannedAppend | None:
        """The optimistic plan of an append: its rows and snapshots after the head this
        process left after its last append to the session (taken from the cache, so that
        no other writer of this process extends the same head).

        Returns ``None`` — the locked path must run — when no head is remembered, the
        caller expects another head, or a snapshot is due whose state is not cached.
        """
        known = self.planner.take_head(req.session)
        if known is None or (req.expected is not None and req.expected != known.head):
            return None  # the caller expects another head: let the locked path decide
        if req.ids is not None and known.head_turn > 1 and self.sealer.may_have_sealed:
            # A sealed event's id is not in the unique index the optimistic insert relies
            # on: the locked path looks for the ids in the session's segments too.
            return None
        rows, prev, turn = event_rows(
            known, req.session, req.encoded, req.ids, req.actor, req.meta, now, req.natives
        )
        plan = self.planner.plan(known, req.action_dicts, rows[-1].version)
        if plan is None:
            return None
        return PlannedAppend(req, known, rows, prev, turn, plan, now)

    def append_planned(self, planned: Sequence[PlannedAppend]) -> list[bool]:
        """Write several sessions' optimistic appends in one transaction (group commit).

        Each is written only if its session's head is still the one it was planned on and
        the session is open (as the optimistic path checks); one whose check fails writes
        nothing, the others are written all the same. At most one append per session.
        After the commit, pass each written one to :meth:`appended`; run the others again
        with :meth:`append_request`.

        Raises:
            EventIdRace: an event id is already recorded (nothing was written).
            StorageError: as :meth:`Storage.append_batches <eventstore.storage.interface.Storage.append_batches>`.
        """
        return self.storage.append_batches([p.batch() for p in planned])

    def _append(self, req: AppendRequest, fast: bool) -> AppendResult:
        st = self.storage
        now = now_micros()
        # Optimistic path: the head check is part of the write, and so are the snapshots
        # this batch reaches (PostgreSQL: one statement, its own transaction).
        p = self.plan_optimistic(req, now) if fast else None
        if p is not None and st.append_fast(
            p.row.pk, p.row.head, p.row.head_hash, p.rows, p.turn, p.plan.snapshots, p.plan.blobs, p.effect()
        ):
            return self.appended(p)
        session, ids = req.session, req.ids
        with st.write(session=session, expected=req.expected) as tx:
            row = self.lock_for_append(tx, session, req.expected)
            if ids is not None:
                prior = st.events_by_id(tx, row.pk, ids)
                if prior:
                    return replayed(
                        session, prior, ids, req.encoded, req.actor, req.meta, req.natives
                    )
            self.check_open(tx, row)
            if req.expected is not None and row.head != req.expected:
                raise ConcurrencyError(session, req.expected, row.head)
            rows, prev, turn, plan = self.write_locked(
                tx, row, req.action_dicts, req.encoded, ids, req.actor, req.meta, now, req.natives
            )
        return self.appended(PlannedAppend(req, row, rows, prev, turn, plan, now))

    def lock_for_append(self, tx: Tx, session: str, expected: int | None = None) -> SessionRow:
        """Lock a session's row for an append, creating the session if it is new.

        Raises:
            ConcurrencyError: the session is new and ``expected`` is neither ``None`` nor 0.
        """
        st = self.storage
        row = st.lock_session(tx, session)
        if row is None:
            if expected not in (None, 0):
                raise ConcurrencyError(session, expected, 0)
            check_new_session_id(session)
            row = self.insert_new_session(tx, NewSession(id=session, created_at=now_micros()))
            if row is None:  # created concurrently: wait for its lock
                row = st.lock_session(tx, session)
                assert row is not None
        return row

    def check_open(self, tx: Tx, row: SessionRow) -> SessionControl:
        """The session's control row, once it is known not to be closed.

        Raises:
            SessionClosed: the session was closed to writes.
        """
        control = self.storage.get_control(tx, row.pk)
        if control.closed_at is not None:
            raise SessionClosed(row.id, control.closed_reason)
        return control

    def write_locked(
        self,
        tx: Tx,
        row: SessionRow,
        action_dicts: list[dict[str, Any]],
        encoded: list[tuple[str, bytes]],
        ids: Sequence[str] | None,
        actor: str | None,
        meta: bytes | None,
        now: int,
        natives: Sequence[bytes | None] | None = None,
    ) -> tuple[list[EventRow], bytes, int, AppendPlan]:
        """Write a batch after the head of a locked row: events, head, due snapshots.

        Returns:
            ``(rows, new head hash, new head turn, plan)``; after the commit, pass the
            new head row and the plan to ``planner.committed``.
        """
        st = self.storage
        planner = self.planner
        rows, prev, turn = event_rows(row, row.id, encoded, ids, actor, meta, now, natives)
        head = rows[-1].version
        st.insert_events(tx, rows)
        st.set_head(tx, row.pk, head, prev, turn)
        catalogue_rows.apply_effect(tx, row.pk, catalogue_effect(action_dicts, now))
        plan = planner.plan(row, action_dicts, head)
        if plan is None:
            # Re-read the row: a compaction elsewhere may have moved its baseline.
            fresh = st.get_session(tx, row.id) or row
            plan = planner.plan(row, action_dicts, head, self.state_at(tx, fresh, row.head))
            assert plan is not None
        for snap in plan.snapshots:
            st.put_snapshot(tx, snap, plan.blobs if snap is plan.snapshots[0] else {})
        return rows, prev, turn, plan

    def appended(self, p: PlannedAppend) -> AppendResult:
        """Bookkeeping after a committed append: caches, and the result."""
        head = p.rows[-1].version
        self.planner.committed(head_after(p.row, head, p.prev, p.turn), p.plan)
        return AppendResult(
            session=p.row.id,
            version=head,
            first_version=p.row.head + 1,
            count=len(p.rows),
            event_ids=p.request.ids,
            recorded_at=to_datetime(p.now),
        )

    # -- reads --------------------------------------------------------------------------

    def head(self, session: Any) -> int:
        """The newest version of a session."""
        return self.session_row(session).head

    def history(
        self,
        session: Any,
        *,
        after: Any = None,
        upto: Any = None,
        limit: Any = None,
        desc: Any = False,
    ) -> Iterator[RecordedEvent]:
        """The events of a session's lineage (see :meth:`eventstore.EventStore.history`)."""
        v = self.validate
        v.version(after, "after")
        v.version(upto, "upto")
        v.count(limit, "limit")
        v.flag(desc, "desc")
        with self.storage.read() as tx:
            row = self.row(tx, session)
            lineage = self.lineage(tx, row)
            names = self.event_names(tx, lineage)
        return self._iter_history(history_segments(lineage, row, after, upto), names, limit, desc)

    def event_names(self, tx: Tx, lineage: Sequence[SessionRow]) -> dict[int, str]:
        """The id each row of a lineage reports its events under: the id of the session
        they were appended to (a kept line's events: the id that was rewound)."""
        names = {r.pk: r.id for r in lineage}
        return Rewinds(self.storage.list_rewinds(tx, pks=names.keys())).event_names(names)

    def _iter_history(
        self, segs: list[Segment], names: dict[int, str], limit: int | None, desc: bool
    ) -> Iterator[RecordedEvent]:
        left = limit
        for seg in reversed(segs) if desc else segs:
            lo, hi = seg.after, seg.upto
            while lo < hi and (left is None or left > 0):
                size = HISTORY_CHUNK if left is None else min(left, HISTORY_CHUNK)
                with self.storage.read() as tx:
                    rows = self.storage.read_events(tx, seg.session_pk, after=lo, upto=hi, limit=size, desc=desc)
                if not rows:
                    break
                for e in rows:
                    yield recorded(e, names[e.session_pk])
                if left is not None:
                    left -= len(rows)
                if desc:
                    hi = rows[-1].version - 1
                else:
                    lo = rows[-1].version
                if len(rows) < size:
                    break

    # -- live follow and the feed --------------------------------------------------------

    def follow_plan(
        self, session: Any, *, after: Any = 0, idle_timeout: Any = None, state: FollowState | None = None
    ) -> Live:
        """What following a session reads (validated, the session looked up): the past as
        :meth:`history` gives it, then the session's own new events. The sync follower
        (:meth:`follow`) and the async one drive it, each with its own waits."""
        v = self.validate
        v.id(session, "session")
        start = v.count(after, "after") or 0
        idle = v.timeout(idle_timeout)
        with self.storage.read() as tx:
            row = self.row(tx, session)
            lineage = self.lineage(tx, row)
            names = self.event_names(tx, lineage)
        if start > row.head:
            raise VersionNotFound(
                row.id, start, row.head,
                f"session {row.id!r} has no version {start} to follow after (its head is {row.head})",
            )
        past = self._iter_history(history_segments(lineage, row, start, None), names, None, False)
        last = max(start, row.head)
        st = self.storage

        def read() -> tuple[list[RecordedEvent], bool, bool]:
            nonlocal last
            # A session's versions are written under its row lock, so version v + 1 is
            # never visible before v: reading on from the last version skips nothing.
            with st.read() as tx:
                rows = st.read_events(tx, row.pk, after=last, upto=MAX_VERSION, limit=HISTORY_CHUNK)
                moved = Rewinds(st.list_rewinds(tx, pks=(row.pk,))).by_kept.get(row.pk)
            full = len(rows) == HISTORY_CHUNK
            if moved is not None:
                # The id was rewound: what the row holds up to the old head was committed
                # before the rewind and is handed out; then the follower ends.
                rows = [e for e in rows if e.version <= moved.from_head]
                if not rows:
                    raise SessionRewound(row.id, moved.to_version, moved.kept_id)
                full = True
            if rows:
                last = rows[-1].version
            return [recorded(e, row.id) for e in rows], False, full

        return Live(past, read, Pacer(idle, time.monotonic()), state or FollowState(time.time))

    def feed_plan(
        self, *, after: Any = None, idle_timeout: Any = 1.0, state: FollowState | None = None
    ) -> Live:
        """What the feed reads (arguments validated): pages in feed order after a position,
        below the storage's barrier. Driven like :meth:`follow_plan`."""
        key = self.validate.position(after, "after")
        idle = self.validate.timeout(idle_timeout)
        st = self.storage
        bands = Bands() if st.feed_banded else None

        def read() -> tuple[list[RecordedEvent], bool, bool]:
            nonlocal key, bands
            # The key moves only once the page's transaction has ended and its rows are
            # about to be handed out: a connection lost between the page and the commit (a
            # server restart) makes the retried read start from the same key, not after
            # rows it never handed out.
            after_key = None if key is None else key.as_tuple()
            if bands is None:
                with st.read() as tx:
                    rows = st.read_feed(tx, after=after_key, limit=FEED_CHUNK)
                    full = len(rows) == FEED_CHUNK
                    # At the end: are committed events waiting behind an older open transaction?
                    pending = not full and st.feed_barrier(tx).pending
                last = rows[-1] if rows else None
                next_key = key
                if last is not None:
                    next_key = FeedKey(last.xact, last.session_pk, last.version)
                next_bands = None
            else:
                band = st.read_band(after=after_key, limit=bands.limit, upto=bands.upto(key))
                rows = band.rows
                upto = bands.upto(key, band.below)
                next_key, full, next_bands = bands.read(key, rows, upto, band.below)
                pending = not full and band.pending
            key, bands = next_key, next_bands
            out = [recorded_from_feed(r) for r in rows]
            if rows:
                out = self.feed_names(out, {r.session_pk for r in rows}, [r.session_pk for r in rows])
            return out, pending, full

        return Live(iter(()), read, Pacer(idle, time.monotonic()), state or FollowState(time.time))

    def feed_names(
        self, events: list[RecordedEvent], pks: Iterable[int], pk_of: Sequence[int]
    ) -> list[RecordedEvent]:
        """Feed events named as :meth:`history` names them (``pk_of``: each one's row): a
        kept line's under the id that was rewound, not the kept id."""
        with self.storage.read() as tx:
            kept = Rewinds(self.storage.list_rewinds(tx, pks=set(pks))).by_kept
        if not kept:
            return events
        return [
            replace(e, session_id=kept[pk].session_id) if pk in kept else e
            for e, pk in zip(events, pk_of, strict=True)
        ]

    def follow(self, session: Any, *, after: Any = 0, idle_timeout: Any = None) -> Follower:
        """A session's events after a version, then each new one as it is committed
        (see :meth:`eventstore.EventStore.follow`)."""
        plan = self.follow_plan(session, after=after, idle_timeout=idle_timeout)
        return Follower(self._live(plan), plan.state, self.storage.watcher().wake)

    def feed(self, *, after: Any = None, idle_timeout: Any = 1.0) -> Follower:
        """Every session's events in one resumable stream (see :meth:`eventstore.EventStore.feed`)."""
        plan = self.feed_plan(after=after, idle_timeout=idle_timeout)
        return Follower(self._live(plan), plan.state, self.storage.watcher().wake)

    def _live(self, plan: Live) -> Iterator[RecordedEvent]:
        """Hand out the plan's past, then what its ``read`` returns, waiting for the
        storage's change watcher between reads that reached the end (the decisions are
        the plan's; the async twin drives the same plan in :func:`eventstore.engine.async_bridge.live`)."""
        for ev in plan.past:
            if not plan.handing_out(ev):
                return
            yield ev
        plan.past_done(time.monotonic())
        watcher = self.storage.watcher()
        while not plan.state.closed:
            seen = watcher.generation()
            try:
                batch, pending, full = plan.read()
            except StorageError as exc:
                delay = plan.after_failure(exc.retryable, time.monotonic())
                if delay is None:
                    raise
                time.sleep(delay)
                continue
            plan.read_ok()
            for ev in batch:
                if not plan.handing_out(ev):
                    return
                yield ev
            wait = plan.after_read(bool(batch), pending, full, time.monotonic())
            if wait is None:
                return
            if wait and watcher.wait(seen, wait_arg(wait)) != seen:
                self.storage.others_committed()

    def catalogue_at(self, tx: Tx, row: SessionRow, version: int) -> dict[str, Any]:
        """The catalogue's ``status`` and ``first_text`` of a session at a version (for a
        row that starts there: a branch, a rewound head)."""
        if version == row.head:
            own = catalogue_rows.rows_by_pk(tx, [row.pk]).get(row.pk)
            if own is not None:
                return {"status": own.status, "first_text": own.first_text}
        status, first_text = state_catalogue(self.state_at(tx, row, version))
        return {"status": status, "first_text": first_text}

    def refresh_catalogue(self, tx: Tx, pk: int) -> None:
        """Set a session's catalogue columns from its state at its head (after a write that
        moved the head without knowing the batch: an import)."""
        row = self.storage.get_session_by_pk(tx, pk)
        status, first_text = state_catalogue(self.state_at(tx, row, row.head))
        updated = row.created_at
        if row.head > (row.fork_version or 0):
            ev = self.storage.event_at(tx, row.pk, row.head)
            if ev is not None:
                updated = ev.recorded_at
        catalogue_rows.apply_effect(tx, pk, absolute_effect(status, first_text, updated))

    def carry_catalogue(self, tx: Tx, from_pk: int, to_pk: int, updated_at: int) -> None:
        """The session id moved from row ``from_pk`` to ``to_pk`` (a rewind): the new row keeps
        the conversation's title, owner and metadata, and its last activity is ``updated_at``."""
        catalogue_rows.carry_info(tx, from_pk, to_pk, updated_at)

    def session_rows(self) -> list[SessionRow]:
        """Every session row, oldest first."""
        with self.storage.read() as tx:
            return self.storage.list_sessions(tx)

    def sessions(self) -> list[SessionInfo]:
        """Every session (roots and branches), oldest first."""
        with self.storage.read() as tx:
            rows = self.storage.list_sessions(tx)
            controls = self.storage.list_controls(tx)
            rewinds = Rewinds(self.storage.list_rewinds(tx))
            return self.infos(tx, rows, {r.pk: r for r in rows}, controls, rewinds)

    def infos(
        self,
        tx: Tx,
        rows: Sequence[SessionRow],
        known: Mapping[int, SessionRow],
        controls: Mapping[int, SessionControl],
        rewinds: Rewinds,
    ) -> list[SessionInfo]:
        """The :class:`SessionInfo` of each row (``known``: rows by pk, for naming parents;
        a rewind's rows are reported as :class:`eventstore.core.rewinds.Rewinds` says),
        with its catalogue fields."""
        catalogue = catalogue_rows.rows_by_pk(tx, [r.pk for r in rows])
        out = []
        for r in rows:
            parent, fork = rewinds.parent(r, known)
            out.append(
                session_info(
                    controls.get(r.pk),
                    id=r.id,
                    parent=parent,
                    fork_version=fork,
                    head=r.head,
                    baseline=r.baseline,
                    created_at=to_datetime(r.created_at),
                    head_turn=r.head_turn,
                    **catalogue_fields(catalogue.get(r.pk)),
                )
            )
        return out

    # -- branch -------------------------------------------------------------------------

    def branch(self, session: Any, *, at: Any = None, new_id: Any = None) -> str:
        """Fork a session copy-on-write (see :meth:`eventstore.EventStore.branch`)."""
        v = self.validate
        v.id(session, "session")
        v.version(at, "at")
        if new_id is None:
            new_id = f"{session}-{uuid.uuid4().hex[:8]}"
        v.id(new_id, "new_id")
        check_new_session_id(new_id, "new_id")
        st = self.storage
        with st.write() as tx:
            row = st.lock_session(tx, session)
            if row is None:
                raise self.missing(tx, session)
            new = self.fork_of(tx, row, check_version(row, at), new_id, now_micros())
            if self.insert_new_session(tx, new) is None:
                taken = st.get_session(tx, new_id)
                if taken is not None:
                    self.check_open(tx, taken)
                raise SessionExists(new_id)
        return str(new_id)

    def fork_of(self, tx: Tx, row: SessionRow, fork: int, new_id: str, created_at: int) -> NewSession:
        """The row of a branch of ``row`` at version ``fork`` (already checked)."""
        h, turn = self.hash_turn_at(tx, row, fork)
        return NewSession(
            id=new_id,
            created_at=created_at,
            parent_pk=row.pk,
            fork_version=fork,
            head=fork,
            head_hash=h,
            head_turn=turn,
            # What the parent compacted away is gone for the branch too.
            baseline=row.baseline,
            baseline_hash=row.baseline_hash,
            baseline_turn=row.baseline_turn,
            **self.catalogue_at(tx, row, fork),
        )

    # -- compaction primitive -----------------------------------------------------------

    def compact_baseline(self, session: Any, upto: Any, *, actor: Any = None) -> CompactionRecord:
        """Make the state at ``upto`` the session's baseline and delete what it replaces.

        One transaction: the baseline snapshot is written first, then ``sessions.baseline``
        moves, then the session's own events ``1..upto`` are deleted under a compaction
        permit — except those a branch forked from this session still reads (at or below
        its fork version). Loading below ``upto`` then raises :class:`CompactedError`;
        every version at or above it loads exactly as before, and so does every branch.

        The compaction record (:meth:`Storage.record_compaction
        <eventstore.storage.interface.Storage.record_compaction>`) is written in the same
        transaction, before the delete: it binds the baseline to the chain (the hash at
        ``upto``, the digest of the baseline state, the hashes of every version removed),
        so ``verify`` can check the baseline snapshot and a checkpoint can still vouch for
        the removed versions.

        Returns:
            A :class:`CompactionRecord` (a no-op when ``upto`` is the current baseline).

        Raises:
            InvalidEvent: an argument is malformed (``upto`` is required).
            SessionNotFound, VersionNotFound, CompactedError: as for a load.
        """
        self.validate.id(session, "session")
        if self.validate.version(upto, "upto") is None:
            raise InvalidEvent("upto must be an integer version, got None", field="upto")
        self.validate.optional_id(actor, "actor")
        st = self.storage
        new_blobs: set[bytes] = set()
        with st.write() as tx:
            row = st.lock_session(tx, session)
            if row is None:
                raise self.missing(tx, session)
            v = check_version(row, upto)
            keep = st.max_child_fork(tx, row.pk)
            if v == row.baseline:
                return CompactionRecord(session, v, row.baseline, 0, keep)
            # The snapshot first: it is what keeps the state after the delete.
            state = self.state_at(tx, row, v)
            self.put_snapshot(tx, row.pk, v, state, new_blobs)
            h, turn = self.hash_turn_at(tx, row, v)
            self.record_compaction(tx, row, v, h, turn, state_digest(state), actor)
            deleted = st.compact(
                tx,
                row.pk,
                upto=v,
                keep_upto=max(keep or 0, row.fork_version or 0),
                baseline_hash=h,
                baseline_turn=turn,
            )
        return CompactionRecord(session, v, row.baseline, deleted, keep)

    def record_compaction(
        self, tx: Tx, row: SessionRow, upto: int, h: bytes, turn: int, digest: bytes, actor: str | None
    ) -> None:
        """Write the compaction record of moving ``row``'s baseline to ``upto``.

        A branch whose new baseline is at or below its fork point removes none of its own
        events: its record keeps no hashes, only the baseline's hash, turn and state digest.
        """
        now = now_micros()
        if upto > (row.fork_version or 0):
            self.storage.record_compaction(tx, row.pk, upto=upto, state_digest=digest, compacted_at=now, actor=actor)
            return
        self.storage.insert_compaction(
            tx,
            CompactionRow(
                session_pk=row.pk,
                upto=upto,
                previous_baseline=row.baseline,
                baseline_hash=h,
                baseline_turn=turn,
                state_digest=digest,
                first_version=upto + 1,
                removed_hashes=b"",
                compacted_at=now,
                actor=actor,
            ),
        )
