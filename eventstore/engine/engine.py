"""The engine's operations, each in its own transactions: load, append, read, branch, compact.

:class:`Engine` validates arguments (:mod:`eventstore.core.validation`), resolves session rows and
lineages, computes states at versions, plans and writes snapshots, and holds the
compaction primitive and the hash lookups. Its logic lives in :mod:`eventstore.core.appends`
(pure functions over rows); this class adds only the synchronous storage calls around it.
The steps over an open transaction are :mod:`eventstore.engine.transaction_steps` (its base
class); reading events out (history chunks, follow, the feed) is :mod:`eventstore.engine.reads`.
:class:`~eventstore.store.EventStore` is a thin facade over it, and the feature modules
(:mod:`~eventstore.features.timetravel`, :mod:`~eventstore.features.compaction`,
:mod:`~eventstore.features.exporting`, :mod:`~eventstore.features.importing`,
:mod:`~eventstore.features.integrity`) take an engine, never the facade.

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

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from eventstore.core.appends import (
    State,
    check_version,
    event_rows,
    head_after,
    history_segments,
    replayed,
    state_from_parts,
)
from eventstore.core.catalogue import effect as catalogue_effect
from eventstore.core.segments import SegmentCodec
from eventstore.core.codec import encode_action, encode_metadata, state_digest
from eventstore.core.feed_rules import Follower
from eventstore.core.ids import check_new_session_id
from eventstore.core.models import check_json, parse_actions
from eventstore.core.records import (
    AppendResult,
    CompactionRecord,
    RecordedEvent,
    SessionInfo,
    to_datetime,
)
from eventstore.core.reducer import REDUCER_VERSION
from eventstore.core.rewinds import Rewinds
from eventstore.core.rows import CatalogueEffect, EventRow, SessionRow, TurnBatch
from eventstore.core.validation import MAX_VERSION, Limits, Validator
from eventstore.engine.planner import AppendPlan, AppendPlanner
from eventstore.engine.sealer import SealPolicy, Sealer
from eventstore.engine.reads import OpenFollowers, feed_plan, follow_plan, iter_history
from eventstore.engine.transaction_steps import TransactionSteps, now_micros
from eventstore.errors import ConcurrencyError, InvalidEvent, SchemaError, SessionExists
from eventstore.storage import Storage, open_storage
from eventstore.storage.interface import AsyncChangeWatcher, EventIdRace, Tx
from eventstore.storage.migrate import HEAD_REVISION

__all__ = ["Engine", "Tx", "AppendRequest", "PlannedAppend", "DEFAULT_SNAPSHOT_EVERY"]

#: Chosen from ``python -m benchmarks store`` and ``seal`` (see benchmarks/RESULTS.md,
#: "## Store" and "## Sealed segments"): once closed turns are sealed, the snapshots are
#: most of what a session stores (each re-stores the newest messages), and 256 halves
#: them while a load still folds fewer than 256 events.
DEFAULT_SNAPSHOT_EVERY = 256


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


class Engine(TransactionSteps):
    """Storage, the validator and the append planner, with the sync calls that join them:
    each operation here runs its own transactions; the steps it composes inside one
    transaction (and that features compose) are :class:`TransactionSteps`'.

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
        if type(seal) is not bool and not isinstance(seal, SealPolicy):
            raise InvalidEvent(f"seal must be True, False or a SealPolicy, got {seal!r}", field="seal")
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
        self.storage: Storage = open_storage(url, segment_coder=SegmentCodec(), **storage_options)
        #: The sync followers still open, ended by :meth:`close`.
        self.followers = OpenFollowers()
        policy = SealPolicy() if seal is True else (seal or None)
        #: Whether closed turns are sealed in the background (``seal=``).
        self.seal_enabled = policy is not None
        # Over asyncio drivers the worker is a task of the store's event loop, not a thread.
        self.sealer = Sealer(self, policy=policy, on_loop=bool(storage_options.get("use_asyncio", False)))
        if self.sealer.background:
            self.planner.on_new_turn = self.sealer.wake
            self.planner.on_append = self.sealer.appended

    # -- lifecycle and schema -----------------------------------------------------------

    def close(self) -> None:
        """End the followers, release every connection and forget the caches."""
        self.followers.close()
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
        url = self.safe_url
        if rev is None:
            raise SchemaError(f"the database {url} has no eventstore schema; run `eventstore migrate`")
        if rev != HEAD_REVISION:
            raise SchemaError(
                f"the database {url} has eventstore schema revision {rev}, this version "
                f"needs {HEAD_REVISION}; run `eventstore migrate`"
            )

    # -- transactions the features compose steps in -------------------------------------

    def reading(self) -> AbstractContextManager[Tx]:
        """A read transaction: one consistent view of the database for the steps run in it."""
        return self.storage.read()

    def writing(self) -> AbstractContextManager[Tx]:
        """A write transaction: the steps run in it commit together when the block ends
        without an exception, or not at all."""
        return self.storage.write()

    def async_watcher(self) -> AsyncChangeWatcher:
        """What an asyncio follower waits on between reads: woken by each commit."""
        return self.storage.watcher(asyncio=True)

    @property
    def safe_url(self) -> str:
        """The database's URL with any password masked (for messages and checkpoints)."""
        return self.storage.safe_url

    # -- rows and states, each read in its own transaction ------------------------------

    def session_row(self, session: Any) -> SessionRow:
        """:meth:`row` in a read transaction of its own."""
        with self.storage.read() as tx:
            return self.row(tx, session)

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
                    return state_from_parts(parts, v, self.planner.codec)
        with self.storage.read() as tx:
            row = self.row(tx, session)
            return self.state_at(tx, row, check_version(row, version))

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

    def append(self, *args: Any, **kwargs: Any) -> AppendResult:
        """Validate and append a batch: :meth:`prepare_append`'s arguments (see
        :meth:`eventstore.EventStore.append`); at the sealing backlog's cap, seal the
        session waiting longest before returning."""
        result = self.append_request(self.prepare_append(*args, **kwargs))
        self.sealer.assist()
        return result

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
            StorageError: as :meth:`Storage.append <eventstore.storage.interface.Storage.append>`.
        """
        return self.storage.append([p.batch() for p in planned])

    def _append(self, req: AppendRequest, fast: bool) -> AppendResult:
        st = self.storage
        now = now_micros()
        # Optimistic path: the head check is part of the write, and so are the snapshots
        # this batch reaches (PostgreSQL: one statement, its own transaction).
        p = self.plan_optimistic(req, now) if fast else None
        if p is not None and st.append([p.batch()])[0]:
            return self.appended(p)
        session, ids = req.session, req.ids
        with st.write(session=session, expected=req.expected) as tx:
            row = self.lock_for_append(tx, session, req.expected)
            if ids is not None:
                prior = st.read_events(tx, row.pk, ids=ids)
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
        return iter_history(self.storage, history_segments(lineage, row, after, upto), names, limit, desc)

    def follow(self, session: Any, *, after: Any = 0, idle_timeout: Any = None) -> Follower:
        """A session's events after a version, then each new one as it is committed
        (see :meth:`eventstore.EventStore.follow`)."""
        plan = follow_plan(self, session, after=after, idle_timeout=idle_timeout)
        return self.followers.follower(plan, self.storage)

    def feed(self, *, after: Any = None, idle_timeout: Any = 1.0) -> Follower:
        """Every session's events in one resumable stream (see :meth:`eventstore.EventStore.feed`)."""
        plan = feed_plan(self, after=after, idle_timeout=idle_timeout)
        return self.followers.follower(plan, self.storage)

    def session_rows(self) -> list[SessionRow]:
        """Every session row, oldest first."""
        with self.storage.read() as tx:
            return self.all_rows(tx)

    def sessions(self) -> list[SessionInfo]:
        """Every session (roots and branches), oldest first."""
        with self.storage.read() as tx:
            rows = self.all_rows(tx)
            controls = self.storage.controls(tx)
            rewinds = Rewinds(self.rewinds(tx))
            return self.infos(tx, rows, {r.pk: r for r in rows}, controls, rewinds)

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
        with self.writing() as tx:
            row = self.find_row(tx, session, lock=True)
            if row is None:
                raise self.missing(tx, session)
            new = self.fork_of(tx, row, check_version(row, at), new_id, now_micros())
            if self.insert_new_session(tx, new) is None:
                taken = self.find_row(tx, new_id)
                if taken is not None:
                    self.check_open(tx, taken)
                raise SessionExists(new_id)
        return str(new_id)

    # -- compaction primitive -----------------------------------------------------------

    def compact_baseline(self, session: Any, upto: Any, *, actor: Any = None) -> CompactionRecord:
        """Make the state at ``upto`` the session's baseline and delete what it replaces.

        One transaction: the baseline snapshot is written first, then ``sessions.baseline``
        moves, then the session's own events ``1..upto`` are deleted under a compaction
        permit — except those a branch forked from this session still reads (at or below
        its fork version). Loading below ``upto`` then raises :class:`CompactedError`;
        every version at or above it loads exactly as before, and so does every branch.

        The compaction record (:meth:`TransactionSteps.removed_record
        <eventstore.engine.transaction_steps.TransactionSteps.removed_record>`) is written in the same
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
        new_blobs: set[bytes] = set()
        with self.writing() as tx:
            row = self.find_row(tx, session, lock=True)
            if row is None:
                raise self.missing(tx, session)
            v = check_version(row, upto)
            keep = max(
                (b.fork_version or 0 for b in self.branches(tx, row) if b.parent_pk == row.pk),
                default=None,
            )
            if v == row.baseline:
                return CompactionRecord(session, v, row.baseline, 0, keep)
            # The snapshot first: it is what keeps the state after the delete.
            state = self.state_at(tx, row, v)
            self.put_snapshot(tx, row.pk, v, state, new_blobs)
            h, turn = self.hash_turn_at(tx, row, v)
            self.record_compaction(tx, row, v, h, turn, state_digest(state), actor)
            deleted = self.move_baseline(
                tx,
                row.pk,
                upto=v,
                keep_upto=max(keep or 0, row.fork_version or 0),
                baseline_hash=h,
                baseline_turn=turn,
            )
        return CompactionRecord(session, v, row.baseline, deleted, keep)
