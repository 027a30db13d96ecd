"""The append planner: which snapshots an append reaches, and the per-process caches behind it.

It lives in the engine, not the core, because it is shared mutable state: one planner per
store, guarded by a lock, its caches guesses that the write itself verifies.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eventstore.core.appends import State, snapshot_boundaries
from eventstore.core.codec import SnapshotCodec
from eventstore.core.reducer import REDUCER_VERSION, fold_json
from eventstore.core.rows import SessionRow, SnapshotRow

__all__ = ["AppendPlan", "AppendPlanner"]

_STATE_CACHE = 32
_HEADS_CACHE = 4096


#: A session head as the append path caches it: a state (``None``: the initial state) and
#: the action dicts recorded since, oldest first.
_Head = tuple["State | None", list[dict[str, Any]]]


@dataclass(frozen=True)
class AppendPlan:
    """What an append writes besides its events.

    Attributes:
        snapshots: the snapshot rows the batch reaches.
        blobs: the message-chunk blobs they need.
        head: the new head as the planner caches it (``None``: nothing to cache).
    """

    snapshots: list[SnapshotRow]
    blobs: dict[bytes, bytes]
    head: _Head | None


class AppendPlanner:
    """Snapshot planning for appends, and the per-process caches that make it cheap.

    Two caches, each a guess that the write itself verifies, so a stale entry costs a
    slower path, never a wrong result:

    - the session rows this process left after its appends (the optimistic path's guess
      of the head, checked by the head-moving statement);
    - per session, the state at the head it last wrote, kept as a state plus the actions
      since, keyed by the chain hash so that another writer's append is never mistaken for
      ours.

    No cache of stored blobs: a snapshot always carries its blobs (see :meth:`snapshot`).

    Thread safety: one planner is shared by every thread using a store. Every cache entry
    is *taken* (popped) under a lock and put back after the commit, so two threads never
    extend the same cached head; the snapshot codec's caches are keyed by content and only
    ever hold correct entries, so races there cost only a re-encode.
    """

    def __init__(self, snapshot_every: int, codec: SnapshotCodec | None = None) -> None:
        if snapshot_every < 1:
            raise ValueError("snapshot_every must be positive")
        self.every = snapshot_every
        self.codec = codec or SnapshotCodec()
        self._lock = threading.Lock()
        self._states: OrderedDict[int, tuple[int, bytes, _Head]] = OrderedDict()
        self._reserved = 0
        self._heads: OrderedDict[str, SessionRow] = OrderedDict()
        #: Called with a session's key and how many of its turns closed when an append of
        #: this process starts a new turn in it (the sealer's wake-up; ``None``: nobody
        #: listens).
        self.on_new_turn: Callable[[int, int], None] | None = None
        #: Called as an append of this process begins (it takes the head it extends, or
        #: plans its snapshots) and after it commits: the sealer yields to them.
        self.on_append: Callable[[], None] | None = None
        self._turns: OrderedDict[int, int] = OrderedDict()

    def take_head(self, session: str) -> SessionRow | None:
        """The row this process left after its last append to ``session`` (removed from the
        cache: only one writer at a time may use it)."""
        with self._lock:
            if self.on_append is not None:
                self.on_append()
            return self._heads.pop(session, None)

    def plan(
        self, row: SessionRow, actions: list[dict[str, Any]], head: int, base: State | None = None
    ) -> AppendPlan | None:
        """The snapshots an append from ``row.head`` to ``head`` reaches, and the new head.

        The state at ``row.head`` comes from the cache, or from ``base`` when the caller
        read it from storage. Returns ``None`` when a snapshot is due and neither has it:
        the caller reads the state at ``row.head`` (inside its transaction) and asks again.

        The head is kept as a state plus the actions since it, folded only when a snapshot
        is due: folding one event into a state this fold does not own copies the path it
        changes, the list of every message included, so folding at each append would cost
        O(session) per event.
        """
        if self.on_append is not None:
            self.on_append()
        start = row.head
        boundaries = snapshot_boundaries(start, head, self.every)
        with self._lock:
            cached = self._states.pop(row.pk, None)
        state: State | None
        if cached is not None and cached[0] == start and cached[1] == row.head_hash:
            state, pending = cached[2]
            pending.extend(actions)
        elif start == 0:
            state, pending = None, list(actions)  # a new session: the chain starts here
        elif not boundaries:
            return AppendPlan([], {}, None)
        elif base is None:
            return None
        else:
            state, pending = base, list(actions)
        snaps: list[SnapshotRow] = []
        blobs: dict[bytes, bytes] = {}
        pos = head - len(pending)  # the version of ``state``
        for b in boundaries:
            state = fold_json(state, pending[: b - pos])
            del pending[: b - pos]
            pos = b
            snap, fresh = self.snapshot(row.pk, b, state)
            snaps.append(snap)
            blobs.update(fresh)
        return AppendPlan(snaps, blobs, (state, pending))

    def snapshot(self, pk: int, version: int, state: Mapping[str, Any]) -> tuple[SnapshotRow, dict[bytes, bytes]]:
        """A snapshot row of ``state`` and every blob it refers to.

        Every blob is sent with its snapshot, even one this process wrote before (the
        insert skips blobs already there): erasure collects blobs no snapshot uses, so a
        blob once stored may be gone, and only the writing transaction can make sure it is
        there. Collection locks snapshot writes out while it runs, so a snapshot and its
        blobs are always committed together.
        """
        rest, digests, blobs = self.codec.encode(state)
        return SnapshotRow(pk, version, REDUCER_VERSION, rest, digests), dict(blobs)

    def committed(self, row: SessionRow, plan: AppendPlan | None = None) -> None:
        """Remember what a committed append left: the new head row and its cached state
        (only after commit: a rolled-back head must not be taken as the session's)."""
        with self._lock:
            self._heads[row.id] = row
            if self.on_append is not None:
                self.on_append()
            if self.on_new_turn is not None:
                seen = self._turns.get(row.pk)
                if seen is None or seen < row.head_turn:
                    self._turns[row.pk] = row.head_turn
                    if len(self._turns) > _HEADS_CACHE:
                        self._turns.popitem(last=False)
                    if row.head_turn > 1:  # the turns before it have closed
                        self.on_new_turn(row.pk, 1 if seen is None else row.head_turn - seen)
            if len(self._heads) > _HEADS_CACHE:
                self._heads.popitem(last=False)
            if plan is not None and plan.head is not None:
                self._states[row.pk] = (row.head, row.head_hash, plan.head)
                while len(self._states) > _STATE_CACHE + self._reserved:
                    self._states.popitem(last=False)

    def reserve(self, n: int) -> None:
        """Keep room for ``n`` more cached states (``n`` < 0 gives it back): each open
        streaming turn keeps its session's, or every flush past a snapshot boundary would
        read the state back when more sessions stream than the cache holds."""
        with self._lock:
            self._reserved += n

    def clear(self) -> None:
        """Forget every cached head and state."""
        with self._lock:
            self._states.clear()
            self._heads.clear()
