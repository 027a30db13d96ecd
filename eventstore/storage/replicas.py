"""Read replicas: reads go to a PostgreSQL hot standby, writes only to the primary.

:class:`ReplicatedPostgresStorage` is a :class:`PostgresStorage` on the primary that
routes every read transaction and every one-statement load to a streaming replica when
one is fit to serve it:

- **a copy of the primary**: checked once, at its first contact, before it serves anything
  (see :data:`S_IDENTITY`); one that is not — a standby of this cluster named with another
  database, another schema, a server that restored a backup of it, a standby of another
  primary — never serves a read: it is skipped for the store's life with a
  :class:`ReplicaMismatch` warning saying why;
- **alive**: a replica whose probe or read fails is skipped for a second, then tried again;
- **close enough**: its replay is at most ``max_replica_lag`` seconds behind (measured on
  the replica: 0 when it has replayed all it received, else the age of the last
  transaction it replayed);
- **caught up with this store** (read your writes): it has replayed past the primary's WAL
  position as of this store's last write or primary read. The store waits up to
  ``replica_wait`` seconds for one to get there, then reads from the primary.

A checkout of an explicit version (``load(session, version=v)``) skips the third rule: the
events up to ``v`` never change once written, so any replica that already holds version
``v`` returns exactly what the primary would. If the replica does not hold it yet, the
primary answers.

What it costs: nothing on the write path but setting a flag; the first read after a write
asks the primary for its WAL position (one round trip) and the chosen replica for its
replay position (one round trip, skipped while an earlier answer still proves it is fresh
enough). Nothing is ever written to a replica: its connections are opened with
``default_transaction_read_only=on``, and only reads are routed to it.

The same class serves the asyncio store (``use_asyncio=True``): its replicas are opened
with the same option, every probe is a round trip awaited on the event loop, and the
bounded wait for a replica to catch up sleeps on the loop instead of blocking it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from sqlalchemy import BigInteger, Float, Text, case, cast, extract, func, select
from sqlalchemy.dialects.postgresql import OID
from sqlalchemy.engine import make_url
from sqlalchemy.util import await_

from eventstore.core.rows import Band, LoadParts, TurnBatch
from eventstore.errors import StorageError
from eventstore.storage.interface import AsyncChangeWatcher, ChangeWatcher, SegmentCoder, Tx
from eventstore.storage.postgres import PostgresStorage
from eventstore.storage.sql import Compiled, SqlStorage, compiled
from eventstore.storage.sql.statements import inline
from eventstore.storage.urls import mask_url

__all__ = ["ReplicatedPostgresStorage", "ReplicaMismatch", "read_only_url", "DEFAULT_MAX_REPLICA_LAG"]

#: Seconds of replay lag beyond which a replica is skipped, unless told otherwise.
DEFAULT_MAX_REPLICA_LAG = 1.0
#: Seconds a read waits for a replica to replay this store's last write before it falls
#: back to the primary. Streaming replicas on one network replay within milliseconds.
DEFAULT_REPLICA_WAIT = 0.1
#: Seconds a replica that failed is left alone before it is probed again.
_DOWN_FOR = 1.0

def _lsn(expr: Any) -> Any:
    """A ``pg_lsn`` as a byte offset (bigint), comparable in Python (the constant, untyped
    in the SQL, is read as the function's pg_lsn)."""
    return cast(func.pg_wal_lsn_diff(expr, inline("0/0", Text)), BigInteger)


def _oid(table: str) -> Any:
    """The object id of the table the connection's search_path finds by that name."""
    return cast(cast(func.to_regclass(inline(table, Text)), OID), BigInteger)


# The primary's WAL insert position: at or past the commit record of every transaction
# committed before it was read (even with synchronous_commit off).
S_PRIMARY_LSN = select(_lsn(func.pg_current_wal_insert_lsn()))

_replay = func.pg_last_wal_replay_lsn()
# A replica's state: is it a standby at all, how far it has replayed, and how far behind it
# is. Lag is 0 when it has replayed everything it received (an idle primary must not make
# its replicas look stale), else the age of the last transaction it replayed.
S_REPLICA_STATUS = select(
    func.pg_is_in_recovery(),
    _lsn(_replay),
    case(
        (_replay >= func.pg_last_wal_receive_lsn(), 0.0),
        else_=cast(
            extract("epoch", func.now() - func.pg_last_xact_replay_timestamp()), Float
        ),
    ),
)


# What makes a server a copy of the primary's tables, the same on both: the cluster's
# identifier (a physical copy keeps it; another cluster, even restored from the same backup
# and promoted, still shares it, hence the replay position below), the database's name, and
# the object ids of the store's tables as the connection's search_path finds them (a copy
# has the same ones; another database or schema of this cluster has others, or none), and
# the WAL position: a replica's replay position is checked against the primary's insert
# position read after it (a copy is never ahead of its primary).
_control = func.pg_control_system().table_valued("system_identifier")
S_IDENTITY = select(
    select(_control.c.system_identifier).scalar_subquery(),
    func.current_database(),
    _oid("events"),
    _oid("sessions"),
)
S_REPLICA_IDENTITY = S_IDENTITY.add_columns(_lsn(_replay))
S_PRIMARY_IDENTITY = S_IDENTITY.add_columns(_lsn(func.pg_current_wal_insert_lsn()))


class ReplicaMismatch(UserWarning):
    """A server named as a read replica is not a copy of the primary: it never serves reads."""


def _sleep_on_loop(seconds: float) -> None:
    """``time.sleep`` for engine code running in a greenlet: the event loop sleeps."""
    await_(asyncio.sleep(seconds))


def read_only_url(url: str) -> str:
    """``url`` with ``default_transaction_read_only=on`` added to its connection options.

    Every transaction on such a connection is read-only unless it says otherwise, and this
    package never says otherwise on a replica: a write routed there by mistake fails.
    """
    u = make_url(url)
    options = u.query.get("options", "")
    if not isinstance(options, str):
        options = " ".join(options)
    extra = "-c default_transaction_read_only=on"
    return u.update_query_dict({"options": f"{options} {extra}".strip()}).render_as_string(
        hide_password=False
    )


class _Replica:
    """One replica and what its last probe proved."""

    __slots__ = ("storage", "name", "lsn", "fresh_until", "down_until", "checked", "refused")

    def __init__(self, storage: PostgresStorage, name: str) -> None:
        self.storage = storage
        #: the URL as given (password masked), for messages.
        self.name = name
        #: the replay position (bytes) of the last probe.
        self.lsn = -1
        #: monotonic instant until which the last probe proves the lag within the bound.
        self.fresh_until = 0.0
        #: monotonic instant before which the replica is not tried (it failed).
        self.down_until = 0.0
        #: whether its identity was compared with the primary's, and found to differ.
        self.checked = False
        self.refused = False

    def probe(self, q: Compiled, max_lag: float) -> bool:
        """Ask the replica where it is; whether it may serve reads now.

        Lag grows by at most one second per second, so a probe that found lag ``L`` proves
        the lag within ``max_lag`` for the next ``max_lag - L`` seconds.
        """
        now = time.monotonic()
        try:
            row = self.storage.fetch_one(q)
        except StorageError:
            self.failed()
            return False
        standby, lsn, lag = row
        if not standby or lsn is None:
            # Promoted, or not a replica at all: its data may have diverged from ours.
            self.fresh_until = 0.0
            return False
        self.lsn = max(self.lsn, int(lsn))
        self.fresh_until = now + max_lag - float(lag or 0.0)
        return self.fresh_until > now

    def failed(self) -> None:
        """Leave the replica alone for a while (it is down or its connection broke)."""
        self.fresh_until = 0.0
        self.down_until = time.monotonic() + _DOWN_FOR


class ReplicatedPostgresStorage(PostgresStorage):
    """PostgreSQL storage that reads from streaming replicas and writes to the primary.

    Args:
        url: the primary.
        replicas: URLs of hot standbys streaming from it (at least one).
        max_replica_lag: seconds of replay lag beyond which a replica is skipped.
        replica_wait: seconds a read waits for a replica to replay this store's last write
            (or last primary read) before it reads from the primary instead.
        **options: :class:`PostgresStorage` options, used for every server
            (``use_asyncio=True``: for the asyncio store, see the module's docstring).

    Raises:
        StorageError: a replica URL is not a PostgreSQL URL, or a bound is not a
            non-negative number (``max_replica_lag`` must be positive).
    """

    def __init__(
        self,
        url: str,
        *,
        replicas: Sequence[str],
        max_replica_lag: float = DEFAULT_MAX_REPLICA_LAG,
        replica_wait: float = DEFAULT_REPLICA_WAIT,
        **options: Any,
    ) -> None:
        self.max_replica_lag = _seconds("max_replica_lag", max_replica_lag, positive=True)
        self.replica_wait = _seconds("replica_wait", replica_wait, positive=False)
        urls = _replica_urls(replicas)
        super().__init__(url, **options)
        d = self.engine.dialect
        self._q_primary_lsn = compiled(S_PRIMARY_LSN, d)
        self._q_status = compiled(S_REPLICA_STATUS, d)
        self._q_replica_identity = compiled(S_REPLICA_IDENTITY, d)
        self._q_primary_identity = compiled(S_PRIMARY_IDENTITY, d)
        self._replicas = [
            _Replica(PostgresStorage(read_only_url(u), **options), mask_url(u)) for u in urls
        ]
        self._turn = itertools.count()
        # Engine code of an asyncio store runs in greenlets on the loop: never block it.
        self._sleep = _sleep_on_loop if options.get("use_asyncio") else time.sleep
        # Held for no I/O at all, so greenlets of one loop never wait on it either.
        self._lock = threading.Lock()
        # The primary WAL position this store has seen (bytes); writes and primary reads
        # counted, and how many of them that position is known to cover. A counter, not a
        # flag: a flag cleared by one reader before its answer was stored let a concurrent
        # reader (the background sealer's) take the old position for a new one.
        self._seen = 0
        self._moves = 0
        self._covered = 0
        #: how many reads each side served (for tests and benchmarks; not exact across threads).
        self.reads = {"replica": 0, "primary": 0}

    @property
    def replica_storages(self) -> list[PostgresStorage]:
        """The read-only storages on the replicas, in the order given."""
        return [r.storage for r in self._replicas]

    def use_segments(self, coder: SegmentCoder) -> None:
        super().use_segments(coder)
        for storage in self.replica_storages:
            storage.use_segments(coder)

    # -- writes: the primary, then remember that the position moved --------------------

    @contextmanager
    def write(self, *, session: str | None = None, expected: int | None = None) -> Iterator[Tx]:
        try:
            with super().write(session=session, expected=expected) as tx:
                yield tx
        finally:
            self._moved()

    def append(self, batches: Sequence[TurnBatch]) -> list[bool]:
        try:
            return super().append(batches)
        finally:
            self._moved()

    def migrate(self) -> None:
        try:
            super().migrate()
        finally:
            self._moved()

    def close(self) -> None:
        for r in self._replicas:
            r.storage.close()
        super().close()

    def others_committed(self) -> None:
        """A follower was woken by a commit on the primary: its next read must see it."""
        self._moved()

    # The primary's watchers, telling this storage when they woke a follower.

    def _thread_watcher(self) -> ChangeWatcher:
        return _WokenWatcher(super()._thread_watcher(), self.others_committed)

    def _task_watcher(self) -> AsyncChangeWatcher:
        return _AsyncWokenWatcher(super()._task_watcher(), self.others_committed)

    # -- reads: a fit replica, else the primary ----------------------------------------

    @contextmanager
    def read(self) -> Iterator[Tx]:
        replica = self._pick(self._position())
        if replica is not None:
            stack = ExitStack()
            try:
                tx = stack.enter_context(replica.storage.read())
            except StorageError as exc:
                if not exc.retryable:
                    raise
                replica.failed()  # e.g. stopped since its last probe: the primary reads
            else:
                self.reads["replica"] += 1
                with stack:
                    yield tx
                return
        self.reads["primary"] += 1
        with super().read() as tx:
            yield tx
        self._moved()  # later reads must not go back before what this one saw

    def _read_band(self, *, after: tuple[int, int, int] | None, limit: int, upto: int) -> Band:
        # Through read(), which picks a replica that has replayed what this store saw
        # (the primary's one-round-trip band always reads the primary).
        return SqlStorage._read_band(self, after=after, limit=limit, upto=upto)

    def load_parts(
        self, session_id: str, version: int | None, reducer_version: int
    ) -> LoadParts | None:
        # An explicit version is immutable history: any replica holding it will do.
        replica = self._pick(0 if version is not None else self._position())
        if replica is not None:
            try:
                parts = replica.storage.load_parts(session_id, version, reducer_version)
            except StorageError as exc:
                if not exc.retryable:
                    raise
                replica.failed()
            else:
                if version is None or (
                    parts is not None and parts.row is not None and parts.row.head >= version
                ):
                    self.reads["replica"] += 1
                    return parts
                # The replica has not replayed that version (or the session) yet.
        self.reads["primary"] += 1
        parts = super().load_parts(session_id, version, reducer_version)
        self._moved()
        return parts

    def _moved(self) -> None:
        """A write or a primary read finished: the next read must see past it."""
        with self._lock:
            self._moves += 1

    def _position(self) -> int:
        """The primary WAL position a read must see: this store's last write or primary read."""
        moves = self._moves  # noted before asking: what finished by now, the answer covers
        if moves != self._covered:
            (lsn,) = self.fetch_one(self._q_primary_lsn)
            with self._lock:
                self._seen = max(self._seen, int(lsn))
                self._covered = max(self._covered, moves)
        return self._seen

    def _check(self, r: _Replica) -> bool:
        """Whether ``r`` is a copy of the primary; warns and refuses it for good if not
        (``False`` also when it cannot be asked now: it is down, and asked again later)."""
        try:
            theirs = r.storage.fetch_one(self._q_replica_identity)
        except StorageError:
            r.failed()
            return False
        ours = self.fetch_one(self._q_primary_identity)  # after: a copy is never ahead
        why = _not_a_copy(tuple(ours), tuple(theirs))
        if why is NOT_YET:
            return False  # not replayed that far yet: asked again at a later read
        r.checked = True
        if why is None:
            return True
        r.refused = True
        warnings.warn(
            f"read replica {r.name} is not a copy of the primary "
            f"{self.safe_url} ({why}): it never serves reads; the primary does",
            ReplicaMismatch,
            stacklevel=2,
        )
        return False

    def _pick(self, position: int) -> _Replica | None:
        """A replica fit to serve a read that must see ``position``, or ``None``.

        Replicas are tried in turn (spreading the reads); one that is behind ``position``
        but otherwise fit is polled until ``replica_wait`` runs out.
        """
        n = len(self._replicas)
        start = next(self._turn) % n
        order = self._replicas[start:] + self._replicas[:start]
        behind: list[_Replica] = []
        now = time.monotonic()
        for r in order:
            if now < r.down_until or r.refused or not (r.checked or self._check(r)):
                continue
            probed = False
            if now >= r.fresh_until:
                if not r.probe(self._q_status, self.max_replica_lag):
                    continue
                probed = True
            if r.lsn >= position:
                return r
            if not probed:  # the cached position is too old to tell: ask again
                if not r.probe(self._q_status, self.max_replica_lag):
                    continue
                if r.lsn >= position:
                    return r
            behind.append(r)
        if not behind or self.replica_wait <= 0:
            return None
        deadline = time.monotonic() + self.replica_wait
        # Replay usually trails by a millisecond or two: poll often at first, then back off.
        pause = 0.0005
        while time.monotonic() < deadline:
            self._sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 1.5, 0.005)
            for r in behind:
                if r.probe(self._q_status, self.max_replica_lag) and r.lsn >= position:
                    return r
        return None


#: What :func:`_not_a_copy` says of a standby that has no eventstore tables yet.
NOT_YET = "it has no eventstore tables on its search_path yet"


class _WokenWatcher(ChangeWatcher):
    """A storage's watcher that calls ``woken`` when a wait ends on a new generation."""

    def __init__(self, inner: ChangeWatcher, woken: Callable[[], None]) -> None:
        self._inner, self._woken = inner, woken

    def generation(self) -> int:
        return self._inner.generation()

    def wait(self, seen: int, timeout: float | None) -> int:
        now = self._inner.wait(seen, timeout)
        if now != seen:
            self._woken()
        return now

    def wake(self) -> None:
        self._inner.wake()

    def close(self) -> None:
        self._inner.close()


class _AsyncWokenWatcher(AsyncChangeWatcher):
    """:class:`_WokenWatcher` on the event loop."""

    def __init__(self, inner: AsyncChangeWatcher, woken: Callable[[], None]) -> None:
        self._inner, self._woken = inner, woken

    async def generation(self) -> int:
        return await self._inner.generation()

    async def wait(self, seen: int, timeout: float | None) -> int:
        now = await self._inner.wait(seen, timeout)
        if now != seen:
            self._woken()
        return now

    def wake(self) -> None:
        self._inner.wake()

    async def close(self) -> None:
        await self._inner.close()


def _not_a_copy(primary: tuple[Any, ...], replica: tuple[Any, ...]) -> str | None:
    """Why a server whose :data:`S_IDENTITY` row (then its replay position) is ``replica``
    is not a copy of the primary whose row (then its insert position) is ``primary``."""
    (p_sys, p_db, p_events, p_sessions, p_lsn), (r_sys, r_db, r_events, r_sessions, r_lsn) = primary, replica
    if r_sys != p_sys:
        return f"another cluster: system identifier {r_sys}, the primary's is {p_sys}"
    if r_db != p_db:
        return f"database {r_db!r}, the primary's is {p_db!r}"
    if r_events is None or r_sessions is None:
        # A standby that has not replayed the tables' creation yet (a store just migrated)
        # looks the same as one that will never have them: asked again later, never refused.
        return NOT_YET
    if (r_events, r_sessions) != (p_events, p_sessions):
        return "its eventstore tables are other tables than the primary's (another schema)"
    if r_lsn is None:
        return "it is not a standby: it replays no WAL"
    if r_lsn > p_lsn:
        return "it has replayed past the primary's WAL position: a copy that diverged"
    return None


def _seconds(name: str, value: Any, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StorageError(f"{name} must be a number of seconds, not {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        what = "positive" if positive else "zero or positive"
        raise StorageError(f"{name} must be a {what} number of seconds, not {value!r}")
    return v


def _replica_urls(replicas: Any) -> list[str]:
    if isinstance(replicas, (str, bytes)) or not isinstance(replicas, Sequence):
        raise StorageError(
            f"replicas must be a list of PostgreSQL URLs, not {type(replicas).__name__}"
        )
    if not replicas:
        raise StorageError("replicas must name at least one PostgreSQL URL")
    urls: list[str] = []
    for u in replicas:
        if not isinstance(u, str):
            raise StorageError(f"a replica URL must be a string, not {type(u).__name__}")
        try:
            backend = make_url(u).get_backend_name()
        except Exception as exc:  # noqa: BLE001 - any parse failure is the caller's URL
            raise StorageError(f"not a database URL: {mask_url(u)!r} ({exc})") from exc
        if backend not in ("postgresql", "postgres"):
            raise StorageError(
                f"a read replica must be a PostgreSQL server, not {backend!r} ({mask_url(u)})"
            )
        urls.append(u)
    return urls
