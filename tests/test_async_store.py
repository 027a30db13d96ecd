"""AsyncEventStore on both backends: parity with EventStore, many tasks on one store, a
responsive event loop, connections released, prepared statements off, both forms at once.

The store contract itself runs on both twins through the ``twins`` marker (see
tests/conftest.py and tests/twins.py); this file holds what only the async form has.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest
from sqlalchemy.util import await_

from conftest import make_store, wait_until
from eventstore import (
    AsyncEventStore,
    ConcurrencyError,
    EventStore,
    InvalidEvent,
    SessionNotFound,
    StorageError,
)
from eventstore.engine.async_bridge import run
from eventstore.engine.engine import Engine
from eventstore.core.reducer import fold_json

T = TypeVar("T")


def _send(msg: str) -> dict[str, Any]:
    return {"type": "send", "id": msg, "text": "x"}


async def _retrying(call: Callable[[], Awaitable[T]]) -> T:
    """``await call()``, retried while SQLite's single writer says it is busy."""
    while True:
        try:
            return await call()
        except StorageError as exc:
            if not exc.retryable:
                raise
            await asyncio.sleep(0.005)


async def _opened(url: str, **options: Any) -> AsyncEventStore:
    store = AsyncEventStore(url, **options)
    await store.migrate()
    return store


# -- parity -----------------------------------------------------------------------------


def _public(cls: type) -> dict[str, Any]:
    return {n: v for n, v in vars(cls).items() if not n.startswith("_")}


def test_every_public_method_has_an_async_twin_with_the_same_signature() -> None:
    sync, twin = _public(EventStore), _public(AsyncEventStore)
    assert set(sync) == set(twin)
    iterators = {"history", "replay"}
    followers = {"follow", "feed"}  # Follower / AsyncFollower: iterators with a lag
    contexts = {"turn": "AsyncStreamingTurn"}  # an async context manager, not a coroutine
    for name, member in sync.items():
        other = twin[name]
        if isinstance(member, property):
            assert isinstance(other, property), name
            continue
        if name in followers:
            assert not inspect.iscoroutinefunction(other), name
            assert inspect.signature(member).return_annotation == "Follower", name
            assert inspect.signature(other).return_annotation == "AsyncFollower", name
            assert list(inspect.signature(member).parameters.values()) == list(
                inspect.signature(other).parameters.values()
            ), name
            continue
        if name in contexts:
            assert not inspect.iscoroutinefunction(other), name
            assert inspect.signature(other).return_annotation == contexts[name], name
            assert list(inspect.signature(member).parameters.values()) == list(
                inspect.signature(other).parameters.values()
            ), name
            continue
        if name in iterators:
            assert not inspect.iscoroutinefunction(other), name
            assert str(inspect.signature(other).return_annotation).startswith("AsyncIterator["), name
        else:
            assert inspect.iscoroutinefunction(other), name
        mine, theirs = inspect.signature(member), inspect.signature(other)
        assert list(mine.parameters.values()) == list(theirs.parameters.values()), name
        if name not in iterators:
            assert mine.return_annotation == theirs.return_annotation, name
    assert inspect.signature(EventStore.__init__) == inspect.signature(AsyncEventStore.__init__)


def _spellings(backend: str, db_url: str) -> list[str]:
    if backend == "sqlite":
        return [db_url, db_url.replace("sqlite:", "sqlite+pysqlite:", 1)]
    return [db_url, db_url.replace("postgresql+psycopg:", "postgresql:", 1)]


def test_both_forms_take_the_same_urls_and_refuse_the_same_ones(backend: str, db_url: str) -> None:
    async def via_async(url: str, n: int) -> int:
        async with await _opened(url) as store:
            return (await store.append(f"a{n}", [_send("u")])).version

    for n, url in enumerate(_spellings(backend, db_url)):
        with make_store(url) as sync_store:
            assert sync_store.append(f"s{n}", [_send("u")]).version == 1
        assert asyncio.run(via_async(url, n)) == 1
    for bad, error in (("mysql://u@h/db", StorageError), ("not a url", StorageError), (42, InvalidEvent)):
        with pytest.raises(error):
            EventStore(bad)  # type: ignore[arg-type]
        with pytest.raises(error):
            AsyncEventStore(bad)  # type: ignore[arg-type]


def test_history_is_an_async_iterator_checked_when_iteration_starts(db_url: str) -> None:
    async def scenario() -> None:
        async with await _opened(db_url) as store:
            await store.append("s1", [_send(f"u-{i}") for i in range(5)])
            it = store.history("missing")  # no I/O yet
            with pytest.raises(SessionNotFound):
                await it.__anext__()
            got = []
            async for e in store.history("s1", desc=True):
                got.append(e.version)
                if len(got) == 2:
                    break  # leaving early holds no connection
            assert got == [5, 4]
            assert [s.event.version async for s in store.replay("s1", after=3)] == [4, 5]

    asyncio.run(scenario())


# -- many tasks on one store ------------------------------------------------------------

SESSIONS = 50
TASKS = 200


def test_200_tasks_append_load_and_branch_on_one_store(db_url: str) -> None:
    """150 writers append to 50 sessions (three per session, retrying on conflict), while
    25 readers load and 25 branchers fork; nothing acknowledged is lost or duplicated and
    every state is the fold of its events."""
    acked: dict[str, list[str]] = {f"s{i}": [] for i in range(SESSIONS)}
    branches: dict[str, tuple[str, int]] = {}

    async def writer(store: AsyncEventStore, n: int) -> None:
        session = f"s{n % SESSIONS}"
        for k in range(4):
            msg = f"t{n}-{k}"
            while True:
                head = await _retrying(lambda: _head_or_zero(store, session))
                try:
                    r = await _retrying(
                        lambda: store.append(session, [_send(msg)], expected_version=head, event_ids=[msg])
                    )
                except ConcurrencyError:
                    await asyncio.sleep(0)
                    continue
                assert r.version == head + 1
                acked[session].append(msg)
                break

    async def reader(store: AsyncEventStore, n: int) -> None:
        rng = random.Random(n)
        for _ in range(6):
            session = f"s{rng.randrange(SESSIONS)}"
            try:
                state = await store.load(session)
            except SessionNotFound:
                await asyncio.sleep(0.001)
                continue
            events = [e.action async for e in store.history(session, upto=len(state.messages))]
            assert state.to_json() == fold_json(None, events)

    async def brancher(store: AsyncEventStore, n: int) -> None:
        session = f"s{n % SESSIONS}"
        for k in range(3):
            try:
                at = await store.head(session)
            except SessionNotFound:
                await asyncio.sleep(0.002)
                continue
            name = f"b{n}-{k}"
            await _retrying(lambda: store.branch(session, at=at, new_id=name))
            branches[name] = (session, at)

    async def scenario() -> None:
        async with await _opened(db_url, snapshot_every=4) as store:
            kinds = [writer] * 150 + [reader] * 25 + [brancher] * 25
            assert len(kinds) == TASKS
            await asyncio.gather(*(kind(store, n) for n, kind in enumerate(kinds)))
            for session, msgs in acked.items():
                events = [e async for e in store.history(session)]
                assert sorted(e.event_id for e in events) == sorted(msgs)  # nothing lost or twice
                assert [e.version for e in events] == list(range(1, len(msgs) + 1))
                state = await store.load(session)
                assert state.to_json() == fold_json(None, [e.action for e in events])
            for name, (parent, at) in branches.items():
                inherited = [e.event_id async for e in store.history(name)]
                own = [e.event_id async for e in store.history(parent, upto=at)]
                assert inherited == own and await store.head(name) == at
            assert (await store.verify()).ok

    asyncio.run(scenario())
    assert sum(map(len, acked.values())) == 150 * 4


async def _rounds_before_served(call: Callable[[], Awaitable[object]], rounds: int = 20) -> int:
    """How many times a task looping on ``call()`` got through before another task, which
    asked once while the loop's first call was in flight, was served."""
    served_after: list[int] = []
    done = 0

    async def looping() -> None:
        nonlocal done
        for _ in range(rounds):
            await call()
            done += 1
            if served_after:
                return

    async def waiting() -> None:
        await call()
        served_after.append(done)

    await asyncio.gather(looping(), waiting())
    return served_after[0]


def test_a_task_waiting_for_the_pool_is_served_before_one_that_keeps_coming_back(
    backend: str, db_url: str
) -> None:
    """With one pooled connection, a task that reads in a loop gives it up between reads;
    a task already waiting then gets it, rather than waiting until the loop ends (or until
    its pool timeout, when such a loop outlasts it: what 200 tasks on a loaded machine did)."""
    options: dict[str, Any] = {"pool_size": 1}
    if backend != "sqlite":
        options["max_overflow"] = 0

    async def scenario() -> int:
        async with await _opened(db_url, **options) as store:
            await store.append("s", [_send("u")])
            return await _rounds_before_served(lambda: store.head("s"))  # a read transaction

    assert asyncio.run(scenario()) <= 1


async def _head_or_zero(store: AsyncEventStore, session: str) -> int:
    try:
        return await store.head(session)
    except SessionNotFound:
        return 0


# -- a responsive event loop ------------------------------------------------------------


class _StepMeter:
    """The longest the event loop's thread spent in one callback — a task's step from one
    await to the next, a timer, an I/O wake-up — minus the time the kernel kept it
    waiting for a CPU meanwhile (the thread's run-queue delay, Linux schedstat).

    What remains is the callback's own work and any blocking call it made (a sleep, a
    synchronous driver call), whatever else the machine was running: the measure is
    about the code on the loop, not about the scheduler.
    """

    def __init__(self) -> None:
        self.worst = 0.0
        self.worst_callback = ""
        try:
            self._fd: int | None = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
        except OSError:  # no schedstat (not Linux): wall time, scheduler waits included
            self._fd = None

    def _waited(self) -> float:
        """Seconds this thread has spent runnable but waiting for a CPU, so far."""
        if self._fd is None:
            return 0.0
        return int(os.pread(self._fd, 64, 0).split()[1]) / 1e9

    def reset(self) -> None:
        self.worst, self.worst_callback = 0.0, ""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)

    def wrap(self, callback: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any) -> Any:
            t0, w0 = time.perf_counter(), self._waited()
            try:
                return callback(*args)
            finally:
                spent = time.perf_counter() - t0 - (self._waited() - w0)
                if spent > self.worst:
                    self.worst, self.worst_callback = spent, repr(getattr(callback, "__self__", callback))

        return timed


class _MeteredLoop(asyncio.SelectorEventLoop):
    """An event loop that runs every callback it is given through a :class:`_StepMeter`."""

    def __init__(self, meter: _StepMeter) -> None:
        super().__init__()
        self.meter = meter

    def call_soon(self, callback: Callable[..., Any], *args: Any, context: Any = None) -> asyncio.Handle:
        return super().call_soon(self.meter.wrap(callback), *args, context=context)

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any, context: Any = None) -> asyncio.Handle:
        return super().call_soon_threadsafe(self.meter.wrap(callback), *args, context=context)

    def call_at(
        self, when: float, callback: Callable[..., Any], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        return super().call_at(when, self.meter.wrap(callback), *args, context=context)

    def add_reader(self, fd: Any, callback: Callable[..., Any], *args: Any) -> None:
        super().add_reader(fd, self.meter.wrap(callback), *args)

    def add_writer(self, fd: Any, callback: Callable[..., Any], *args: Any) -> None:
        super().add_writer(fd, self.meter.wrap(callback), *args)


def _longest_step(main: Callable[[_StepMeter], Awaitable[None]]) -> tuple[float, str]:
    """Run ``main(meter)`` on a metered loop; the longest step and what it ran."""
    meter = _StepMeter()
    loop = _MeteredLoop(meter)
    try:
        loop.run_until_complete(main(meter))
    finally:
        loop.close()
        meter.close()
    return meter.worst, meter.worst_callback


def test_the_meter_sees_a_blocking_call_and_a_busy_step() -> None:
    """The meter below can fail: a blocking call on the loop, or 80 ms of Python without
    an await, shows as a step of at least 80 ms."""

    async def blocking(_meter: _StepMeter) -> None:
        await asyncio.sleep(0.01)
        time.sleep(0.08)  # what a sync driver call on the loop would do
        await asyncio.sleep(0.01)

    async def busy(_meter: _StepMeter) -> None:
        await asyncio.sleep(0)
        end = time.thread_time() + 0.08  # CPU time: 80 ms of work however long it takes
        while time.thread_time() < end:
            pass
        await asyncio.sleep(0)

    assert _longest_step(blocking)[0] >= 0.08
    assert _longest_step(busy)[0] >= 0.08


def test_no_step_blocks_the_event_loop_for_50_ms_while_100_tasks_append_and_load(db_url: str) -> None:
    """No callback of the loop (one task's Python between two awaits) takes 50 ms while
    100 tasks append and load: round trips await on the loop (psycopg's AsyncConnection;
    aiosqlite's connection threads, where SQLite's write lock is waited for), so the loop
    only ever runs one step's Python between two round trips. One measurement: time the
    scheduler kept the thread off a CPU is not counted (see :class:`_StepMeter`)."""

    async def main(meter: _StepMeter) -> None:
        async with await _opened(db_url, snapshot_every=2) as store:
            await store.append("warm", [_send("u")])  # connect and compile before measuring
            await store.load("warm")
            # A full collection of everything imported so far would pause any step (tens
            # of ms): the interpreter's, not ours. Collect now, and keep those objects
            # out of the collections to come.
            gc.collect()
            gc.freeze()
            await asyncio.sleep(0)  # the meter counts from the next step on
            meter.reset()

            async def task(n: int) -> None:
                session = f"a{n}"
                for i in range(5):
                    await _retrying(lambda: store.append(session, [_send(f"u-{i}")], expected_version=i))
                    assert len((await store.load(session)).messages) == i + 1

            await asyncio.gather(*(task(n) for n in range(100)))

    try:
        worst, callback = _longest_step(main)
    finally:
        gc.unfreeze()
    print(f"longest step: {worst * 1000:.1f} ms ({callback})")
    assert worst < 0.05, f"the loop was blocked for {worst * 1000:.1f} ms by {callback}"


# -- connections ------------------------------------------------------------------------


def _backends_of(admin_dsn: str, app: str) -> int:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchone()
        assert row is not None
        return int(row[0])


def test_async_with_and_close_release_every_connection(pg_schema: str) -> None:
    app = f"es-{uuid.uuid4().hex[:12]}"
    url = f"{pg_schema}&application_name={app}"
    dsn = pg_schema.split("?")[0].replace("postgresql+psycopg://", "postgresql://", 1)

    async def scenario() -> None:
        async with await _opened(url) as store:
            await asyncio.gather(*(store.append(f"s{i}", [_send("u")]) for i in range(8)))
            assert _backends_of(dsn, app) >= 2
        store2 = await _opened(url)
        await store2.load("s1")
        assert _backends_of(dsn, app) >= 1
        await store2.close()

    asyncio.run(scenario())
    # A closed connection's server process exits after the client has gone, so
    # pg_stat_activity can list it for a moment: wait for that, not for luck.
    wait_until(lambda: _backends_of(dsn, app) == 0, "every connection of the closed stores gone")


def test_a_task_waiting_for_a_hot_connection_is_served_before_one_that_keeps_coming_back(
    pg_schema: str,
) -> None:
    """The same turn-taking on the autocommit connections PostgreSQL's loads run on."""

    async def scenario() -> int:
        async with await _opened(pg_schema, pool_size=1, max_overflow=0) as store:
            await store.append("s", [_send("u")])
            return await _rounds_before_served(lambda: store.load("s"))  # one statement

    assert asyncio.run(scenario()) <= 1


def test_loads_survive_terminated_connections_and_appends_fail_retryably(pg_schema: str) -> None:
    """The server drops every connection of the store (a restart, a failover, an idle
    timeout): a load still succeeds, an append either succeeds or fails retryably, and the
    next append succeeds; a closed store refuses further use."""
    app = f"es-{uuid.uuid4().hex[:12]}"
    dsn = pg_schema.split("?")[0].replace("postgresql+psycopg://", "postgresql://", 1)

    def kill_all() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            pids = [pid for pid, _ in conn.execute(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                (app,),
            )]
            # Terminating only signals a backend: the store's connections are dead once they are gone.
            wait_until(
                lambda: not conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchall(),
                "the terminated backends live on",
            )

    async def scenario() -> None:
        store = await _opened(f"{pg_schema}&application_name={app}")
        await asyncio.gather(*(store.append(f"s{i}", [_send("u-0")]) for i in range(4)))
        kill_all()
        assert [len((await store.load(f"s{i}")).messages) for i in range(4)] == [1, 1, 1, 1]
        kill_all()
        for i in range(4):
            try:
                await store.append(f"s{i}", [_send("u-1")], event_ids=["e-1"])
            except StorageError as exc:
                assert exc.retryable
                await store.append(f"s{i}", [_send("u-1")], event_ids=["e-1"])
        assert [await store.head(f"s{i}") for i in range(4)] == [2, 2, 2, 2]
        await store.close()
        with pytest.raises(StorageError):
            await store.load("s0")

    asyncio.run(scenario())


def test_close_ends_the_sqlite_connection_threads(tmp_path: Any) -> None:
    before = threading.active_count()

    async def scenario() -> None:
        async with await _opened(f"sqlite:///{tmp_path / 'c.db'}") as store:
            await asyncio.gather(*(store.append(f"s{i}", [_send("u")]) for i in range(6)))
            assert threading.active_count() > before

    asyncio.run(scenario())
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before


def _prepared_on_every_connection(app: str) -> int:
    """Statements prepared on every live psycopg connection of this process whose
    ``application_name`` is ``app`` (the pool's and the async store's own), as the server
    reports them. Runs inside a greenlet when the connections are async ones."""
    total = 0
    conns = [
        o for o in gc.get_objects()
        if isinstance(o, (psycopg.Connection, psycopg.AsyncConnection))
        and not o.closed
        and o.info.parameter_status("application_name") == app
    ]
    assert conns
    for conn in conns:
        sql = "SELECT count(*) FROM pg_prepared_statements"
        if isinstance(conn, psycopg.AsyncConnection):
            row = await_(await_(conn.execute(sql)).fetchone())
        else:
            row = conn.execute(sql).fetchone()
        total += int(row[0])
    return total


@pytest.mark.parametrize("twin", ["sync", "async"])
@pytest.mark.parametrize("prepare_threshold", [5, None])
def test_prepare_threshold_none_prepares_no_statement(
    pg_schema: str, twin: str, prepare_threshold: int | None
) -> None:
    """What PgBouncer's transaction mode needs: no prepared statement on any connection,
    not even the load's (prepared explicitly otherwise)."""
    app = f"es-{uuid.uuid4().hex[:12]}"
    engine = Engine(
        f"{pg_schema}&application_name={app}", pool_size=1, max_overflow=0,
        prepare_threshold=prepare_threshold, use_asyncio=twin == "async",
    )

    def work() -> int:
        engine.migrate()
        for i in range(8):
            engine.append("s1", [_send(f"u-{i}")], expected_version=i)
            engine.load("s1")
            engine.load("s1", i // 2 + 1)
            engine.head("s1")
        engine.branch("s1", at=3, new_id=f"b{i}")
        engine.load(f"b{i}")
        try:
            return _prepared_on_every_connection(app)
        finally:
            engine.close()

    prepared = asyncio.run(run(work)) if twin == "async" else work()
    if prepare_threshold is None:
        assert prepared == 0
    else:
        assert prepared > 0


# -- both forms on one database -----------------------------------------------------------


def test_sync_and_async_stores_share_a_database_at_the_same_time(db_url: str) -> None:
    """A thread appends through EventStore while tasks append through AsyncEventStore, to
    the same sessions, each retrying on conflict: every append lands exactly once."""
    sync_store = make_store(db_url)
    per_side = 30

    def sync_side() -> None:
        for i in range(per_side):
            msg = f"sync-{i}"
            while True:
                try:
                    try:
                        head = sync_store.head("shared")
                    except SessionNotFound:
                        head = 0
                    sync_store.append("shared", [_send(msg)], expected_version=head)
                    break
                except ConcurrencyError:
                    continue
                except StorageError as exc:
                    if not exc.retryable:
                        raise
                    time.sleep(0.005)

    async def async_side(store: AsyncEventStore, n: int) -> None:
        for i in range(per_side // 3):
            msg = f"async-{n}-{i}"
            while True:
                head = await _retrying(lambda: _head_or_zero(store, "shared"))
                try:
                    await _retrying(lambda: store.append("shared", [_send(msg)], expected_version=head))
                    break
                except ConcurrencyError:
                    await asyncio.sleep(0)

    async def scenario() -> None:
        async with await _opened(db_url) as store:
            thread = threading.Thread(target=sync_side)
            thread.start()
            await asyncio.gather(*(async_side(store, n) for n in range(3)))
            await asyncio.to_thread(thread.join)
            ids = [e.action["id"] async for e in store.history("shared")]
            assert sorted(ids) == sorted(
                [f"sync-{i}" for i in range(per_side)]
                + [f"async-{n}-{i}" for n in range(3) for i in range(per_side // 3)]
            )
            assert (await store.load("shared")).to_json() == sync_store.load("shared").to_json()

    try:
        asyncio.run(scenario())
    finally:
        sync_store.close()


def test_a_reader_cancelled_by_a_cancel_scope_gives_its_connection_back_cleanly(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A web framework ends a stream whose client went away by cancelling a cancel scope,
    which cancels every await in it, cleanup included. A follower or a history cut at any
    point must not break the pool's return of its connection (SQLAlchemy then logs
    "Exception during reset" with a traceback and throws the connection away)."""
    import anyio

    make_store(db_url).close()

    async def main() -> list[int]:
        async with AsyncEventStore(db_url) as store:
            await store.append("s", [_send(f"m{i}") for i in range(3000)])
            rng = random.Random(7)
            for i in range(60):
                with anyio.move_on_after(rng.uniform(0, 0.02)):
                    if i % 2:
                        async for _ in store.history("s"):
                            pass
                    else:
                        async for _ in store.follow("s", idle_timeout=5):
                            pass
            # Still serves, on connections the pool kept.
            return [await store.head("s"), len([e async for e in store.history("s", upto=10)])]

    with caplog.at_level(logging.ERROR, logger="sqlalchemy.pool"):
        assert asyncio.run(main()) == [3000, 10]
    assert not [r for r in caplog.records if r.name.startswith("sqlalchemy.pool")], caplog.text
