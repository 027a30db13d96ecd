"""Read replicas: a store with ``replicas=[...]`` on the real streaming replica of the suite.

`make test` (scripts/with-postgres) starts a hot standby cloned from the test server with
``pg_basebackup -R`` and exports its URL and data directory. Each test works in its own
schema on the primary; the same schema reaches the replica by streaming replication, so
the replica URL carries the same search_path. Reads are asserted to come from where they
must (the storage counts them), and always to equal a primary-only store's. The read
contract runs on both twins (``EventStore`` and ``AsyncEventStore``): they share the routing.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine

from conftest import REPLICA_GROUP, make_store, pg_admin_url, wait_until
from eventstore.errors import StorageError
from eventstore.samples import chat_session
from eventstore import AsyncEventStore, EventStore
from eventstore.storage import open_storage
from eventstore.storage.replicas import read_only_url

REPLICA_ENV = "EVENTSTORE_TEST_PG_REPLICA_URL"

# The tests that take the `twin` fixture run on both; all of them in the replica group.
pytestmark = [pytest.mark.twins, pytest.mark.xdist_group(REPLICA_GROUP)]


def _replica_base() -> str:
    url = os.environ.get(REPLICA_ENV)
    if not url:
        pytest.fail(
            f"{REPLICA_ENV} is not set: replica tests need the streaming replica that "
            "`make test` starts (scripts/with-postgres). They fail rather than skip.",
            pytrace=False,
        )
    return url


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(_dsn(url), autocommit=True) as conn:
        cur = conn.execute(statement)
        return list(cur.fetchall()) if cur.description else []


def _replica_ctl(*args: str) -> None:
    ctl = shlex.split(os.environ.get("EVENTSTORE_TEST_PG_CTL", ""))
    datadir = os.environ.get("EVENTSTORE_TEST_PG_REPLICA_DATADIR", "")
    if not ctl or not datadir:
        pytest.fail("the replica's pg_ctl is not set: run the suite through scripts/with-postgres")
    log = os.environ.get("EVENTSTORE_TEST_PG_REPLICA_LOG", os.devnull)
    subprocess.run(
        [*ctl, "-D", datadir, "-l", log, "-w", "-t", "60", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        timeout=120,
    )


def _until_a_replica_serves(store: EventStore, session: str) -> None:
    """Read until a read is served by the replica: it has replayed all this store saw."""
    start = _reads(store)["replica"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        store.head(session)
        if _reads(store)["replica"] > start:
            return
        time.sleep(0.01)
    pytest.fail("the replica never caught up")


def _until_replay_is_behind(replica: str, seconds: float) -> None:
    """Wait until the replica's last replayed commit is ``seconds`` old by its own clock."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (behind,) = _sql(replica, "SELECT extract(epoch FROM now() - pg_last_xact_replay_timestamp())")[0]
        if behind is not None and float(behind) >= seconds:
            return
        time.sleep(0.01)
    pytest.fail(f"the replica's replay never fell {seconds} s behind")


def _wait_until_paused(replica: str) -> None:
    for _ in range(1000):
        if _sql(replica, "SELECT pg_get_wal_replay_pause_state()")[0][0] == "paused":
            return
        time.sleep(0.01)
    pytest.fail("the replica did not pause its replay")


@pytest.fixture
def replica_url(pg_schema: str) -> str:
    """The replica's URL with the same search_path (the test's schema) as ``pg_schema``."""
    return _replica_base() + pg_schema[len(pg_admin_url()) :]


def _replayed_tables(replica_url: str) -> None:
    """Wait until the replica has replayed the creation of the store's tables: until then
    a store reads from the primary without waiting (a standby without the tables is asked
    again at a later read), which a test that counts replica reads must not race."""
    wait_until(
        lambda: _sql(replica_url, "SELECT to_regclass('events') IS NOT NULL AND to_regclass('sessions') IS NOT NULL")[0][0],
        "the replica replayed the store's tables",
    )


def _replicated(pg_schema: str, replica_url: str, *, copy: bool = True, **options: Any) -> EventStore:
    """A store (migrated) reading from ``replica_url``; for a ``copy`` of the primary, once
    the replica has the store's tables."""
    options.setdefault("max_replica_lag", 60.0)  # a loaded CI machine must not skip it
    options.setdefault("replica_wait", 10.0)
    store = make_store(pg_schema, replicas=[replica_url], **options)
    if copy:
        _replayed_tables(replica_url)
    return store


def _reads(store: EventStore) -> dict[str, int]:
    return store.read_counts


@pytest.fixture
def stores(
    pg_schema: str, replica_url: str, twin: str
) -> Iterator[tuple[EventStore, EventStore]]:
    """(a store reading from the replica, a primary-only store) on the same schema."""
    # Not sealing: its background sealer's reads are counted with the test's, and one
    # that ran while the replica was behind its last seal went to the primary.
    replicated = _replicated(pg_schema, replica_url, seal=False)
    plain = EventStore(pg_schema)
    try:
        yield replicated, plain
    finally:
        replicated.close()
        plain.close()


def test_reads_after_writes_see_the_writes_and_come_from_the_replica(
    stores: tuple[EventStore, EventStore],
) -> None:
    replicated, plain = stores
    actions = chat_session(3, seed=7, deltas=8)
    done = 0
    for n in (1, 5, 17, 1, 1, 30):
        replicated.append("s1", actions[done : done + n], expected_version=done)
        done += n
        # Each read right after a write through the same store sees that write.
        assert replicated.head("s1") == done
        assert replicated.load("s1").to_json() == plain.load("s1").to_json()
    # A streamed turn's group commits move the position as well.
    with replicated.turn("s1", {"type": "send", "id": "u-t", "text": "and?"}) as turn:
        turn.write({"type": "message-start", "messageId": "a-t"})
        turn.write({"type": "text-delta", "messageId": "a-t", "text": "streamed"})
        turn.write({"type": "finish", "reason": "stop"})
    done = plain.head("s1")
    assert replicated.head("s1") == done
    assert replicated.load("s1").to_json() == plain.load("s1").to_json()
    replicated.branch("s1", at=10, new_id="s1-alt")
    assert [s.id for s in replicated.sessions()] == ["s1", "s1-alt"]
    replicated.append("s1-alt", [{"type": "stop"}], expected_version=10)
    assert replicated.load("s1-alt").to_json() == plain.load("s1-alt").to_json()
    for v in (0, 1, 10, done):
        assert replicated.load("s1", version=v).to_json() == plain.load("s1", version=v).to_json()
    assert [e.hash for e in replicated.history("s1")] == [e.hash for e in plain.history("s1")]
    assert replicated.diff(("s1", None), ("s1-alt", None)).to_json() == plain.diff(
        ("s1", None), ("s1-alt", None)
    ).to_json()
    assert list(replicated.replay("s1", upto=12)) == list(plain.replay("s1", upto=12))
    assert replicated.verify().ok
    reads = _reads(replicated)
    assert reads["primary"] == 0 and reads["replica"] > 20


def test_a_stopped_replica_is_skipped_and_the_primary_answers(
    stores: tuple[EventStore, EventStore],
) -> None:
    replicated, plain = stores
    replicated.append("s1", chat_session(1, deltas=4)[:5], expected_version=0)
    assert replicated.head("s1") == 5
    before = _reads(replicated)
    _replica_ctl("-m", "fast", "stop")
    try:
        replicated.append("s1", [{"type": "stop"}], expected_version=5)
        assert replicated.head("s1") == 6
        assert replicated.load("s1").to_json() == plain.load("s1").to_json()
        assert replicated.load("s1", version=3).to_json() == plain.load("s1", version=3).to_json()
        assert len(list(replicated.history("s1"))) == 6
        after = _reads(replicated)
        assert after["replica"] == before["replica"]
        assert after["primary"] >= before["primary"] + 4
    finally:
        _replica_ctl("start")
    # Back up: after its pause it is probed again, catches up and serves reads again.
    _until_a_replica_serves(replicated, "s1")
    assert replicated.load("s1").to_json() == plain.load("s1").to_json()
    assert _reads(replicated)["replica"] > after["replica"]


def test_a_replica_paused_past_the_lag_bound_is_skipped(
    pg_schema: str, replica_url: str, twin: str
) -> None:
    replicated = _replicated(pg_schema, replica_url, max_replica_lag=0.3, replica_wait=0)
    plain = EventStore(pg_schema)
    try:
        plain.append("s1", [{"type": "send", "id": "u-1", "text": "hi"}], expected_version=0)
        _until_a_replica_serves(replicated, "s1")
        _sql(replica_url, "SELECT pg_wal_replay_pause()")
        try:
            _wait_until_paused(replica_url)
            # Written by another store: this one's read-your-writes position does not move,
            # only the replica's lag can send the read to the primary.
            plain.append("s1", [{"type": "stop"}], expected_version=1)
            _until_replay_is_behind(replica_url, 0.6)  # twice the bound
            assert _sql(replica_url, "SELECT count(*) FROM events")[0][0] == 1
            before = _reads(replicated)
            assert replicated.head("s1") == 2
            assert _reads(replicated)["primary"] == before["primary"] + 1
            assert replicated.load("s1").to_json() == plain.load("s1").to_json()
        finally:
            _sql(replica_url, "SELECT pg_wal_replay_resume()")
    finally:
        replicated.close()
        plain.close()


def test_old_versions_come_from_a_replica_that_is_behind_the_head(
    pg_schema: str, replica_url: str, twin: str
) -> None:
    replicated = _replicated(pg_schema, replica_url, replica_wait=0)
    plain = EventStore(pg_schema)
    actions = chat_session(1, deltas=6)
    try:
        replicated.append("s1", actions[:6], expected_version=0)
        _until_a_replica_serves(replicated, "s1")
        _sql(replica_url, "SELECT pg_wal_replay_pause()")
        try:
            _wait_until_paused(replica_url)
            replicated.append("s1", actions[6:], expected_version=6)
            head = len(actions)
            before = _reads(replicated)
            # Immutable history below what the replica holds: the replica serves it.
            old = plain.load("s1", version=4).to_json()
            assert replicated.load("s1", version=4).to_json() == old
            assert _reads(replicated)["replica"] == before["replica"] + 1
            # The head and a version the replica lacks: the primary, with the right answer.
            assert replicated.load("s1").to_json() == plain.load("s1").to_json()
            assert replicated.load("s1", version=head).to_json() == plain.load("s1").to_json()
            assert replicated.head("s1") == head
            assert _reads(replicated)["primary"] == before["primary"] + 3
        finally:
            _sql(replica_url, "SELECT pg_wal_replay_resume()")
    finally:
        replicated.close()
        plain.close()


def test_nothing_is_written_to_a_replica(
    stores: tuple[EventStore, EventStore], pg_schema: str, replica_url: str
) -> None:
    replicated, _ = stores
    replicated.append("s1", chat_session(2, deltas=10), expected_version=0)
    replicated.branch("s1", at=3, new_id="s2")
    assert replicated.head("s2") == 3
    # The store's replica connections refuse writes even on a server that would take them...
    engine = create_engine(read_only_url(replica_url))
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW default_transaction_read_only").scalar() == "on"
    finally:
        engine.dispose()
    # ...and on the replica's side, every row it holds came from the primary's WAL: once
    # caught up, it holds exactly the primary's rows, and it is still a standby.
    query = "SELECT session_pk, version, hash FROM events ORDER BY 1, 2"
    _until_a_replica_serves(replicated, "s2")  # caught up with this store's last write
    assert _sql(replica_url, query) == _sql(pg_schema, query)
    assert _sql(replica_url, "SELECT pg_is_in_recovery()") == [(True,)]
    replica = open_storage(read_only_url(replica_url))
    try:
        with pytest.raises(StorageError):
            with replica.write() as tx:
                tx.exec_driver_sql("INSERT INTO compaction_permits VALUES (1, 1)")
    finally:
        replica.close()


def test_a_server_that_is_not_a_standby_never_serves_reads(pg_schema: str, twin: str) -> None:
    # Named as a replica by mistake, the primary itself: never read from, never written.
    store = make_store(pg_schema, replicas=[pg_schema], replica_wait=0)
    try:
        store.append("s1", [{"type": "send", "id": "u-1", "text": "hi"}], expected_version=0)
        with pytest.warns(Warning, match="is not a copy of the primary .*not a standby"):
            assert store.head("s1") == 1
        assert _reads(store) == {"replica": 0, "primary": 1}
    finally:
        store.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replicas": "postgresql://h/db"}, "list of PostgreSQL URLs"),
        ({"replicas": []}, None),
        ({"replicas": ["sqlite:///x.db"]}, "must be a PostgreSQL server"),
        ({"replicas": [3]}, "must be a string"),
        ({"replicas": ["::not a url::"]}, "not a database URL"),
        ({"replicas": ["postgresql://h/db"], "max_replica_lag": 0}, "positive"),
        ({"replicas": ["postgresql://h/db"], "max_replica_lag": float("nan")}, "positive"),
        ({"replicas": ["postgresql://h/db"], "max_replica_lag": True}, "number of seconds"),
        ({"replicas": ["postgresql://h/db"], "replica_wait": -1}, "zero or positive"),
    ],
)
def test_bad_replica_options_are_refused(options: dict[str, Any], message: str | None) -> None:
    if message is None:  # an empty list: a plain primary-only store
        EventStore("postgresql+psycopg://u@127.0.0.1:1/db", **options).close()
        return
    with pytest.raises(StorageError, match=message):
        EventStore("postgresql+psycopg://u@127.0.0.1:1/db", **options)


def test_replicas_on_sqlite_are_refused(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(StorageError, match="replicas needs PostgreSQL"):
        EventStore(url, replicas=["postgresql+psycopg://u@h/db"])
    with pytest.raises(StorageError, match="max_replica_lag needs PostgreSQL"):
        EventStore(url, max_replica_lag=2.0)
    assert not (tmp_path / "x.db").exists()


def test_the_async_wait_for_a_replica_never_blocks_the_event_loop(
    pg_schema: str, replica_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_sleep = time.sleep

    def sleep_off_the_loop(seconds: float) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return real_sleep(seconds)
        raise AssertionError("time.sleep on a running event loop")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, int], int]:
        async with AsyncEventStore(
            pg_schema, replicas=[replica_url], max_replica_lag=60.0, replica_wait=0.3
        ) as store:
            await store.migrate()
            await asyncio.to_thread(_replayed_tables, replica_url)
            await store.append("s1", [{"type": "send", "id": "u-1", "text": "hi"}])
            await store.load("s1")  # the replica caught up (or the primary answered)
            await asyncio.to_thread(_sql, replica_url, "SELECT pg_wal_replay_pause()")
            try:
                await asyncio.to_thread(_wait_until_paused, replica_url)
                await store.append("s1", [{"type": "stop"}], expected_version=1)
                before = store.read_counts
                ticks = 0

                async def ticker() -> None:
                    nonlocal ticks
                    while True:
                        await asyncio.sleep(0.01)
                        ticks += 1

                task = asyncio.create_task(ticker())
                try:
                    # The replica cannot reach the append: the read waits its 0.3 s on the
                    # loop, other tasks running meanwhile, then the primary answers.
                    got = (await store.load("s1")).to_json()
                finally:
                    task.cancel()
                after = store.read_counts
            finally:
                await asyncio.to_thread(_sql, replica_url, "SELECT pg_wal_replay_resume()")
        with EventStore(pg_schema) as plain:
            want = plain.load("s1").to_json()
        return got, want, {k: after[k] - before[k] for k in after}, ticks

    monkeypatch.setattr(time, "sleep", sleep_off_the_loop)
    got, want, served, ticks = asyncio.run(scenario())
    assert got == want
    assert served == {"replica": 0, "primary": 1}
    assert ticks > 0


@pytest.fixture
def other_database() -> Iterator[str]:
    """Another database of the primary's cluster, on the replica too (it streams the whole
    cluster); yields its name once the replica has it."""
    name = f"other_{os.urandom(5).hex()}"
    _sql(pg_admin_url(), f'CREATE DATABASE "{name}"')
    try:
        replica = _replica_base()
        for _ in range(1000):
            if _sql(replica, f"SELECT count(*) FROM pg_database WHERE datname = '{name}'")[0][0]:
                break
            time.sleep(0.01)
        yield name
    finally:
        _sql(pg_admin_url(), f'DROP DATABASE "{name}" WITH (FORCE)')


def _in_database(url: str, name: str) -> str:
    """``url`` (with its query, the search_path) naming database ``name`` instead."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.mark.parametrize("where", ["another database", "another schema"])
def test_a_replica_that_is_not_a_copy_of_the_primary_never_serves(
    pg_schema: str, replica_url: str, other_database: str, where: str, twin: str
) -> None:
    """A standby of this cluster named with another database (or another schema) holds
    other eventstore tables: it is refused with a warning saying why, and the primary serves
    every read, so read-your-writes holds."""
    schema = pg_schema.rsplit("%3D", 1)[1]
    if where == "another database":
        # The same schema name in another database of the cluster, with content of its own.
        decoy = _in_database(pg_schema, other_database)
        _sql(_in_database(pg_admin_url(), other_database), f'CREATE SCHEMA "{schema}"')
        wrong = _in_database(replica_url, other_database)
    else:
        decoy = pg_schema.replace(schema, f"{schema}_decoy")
        _sql(pg_admin_url(), f'CREATE SCHEMA "{schema}_decoy"')
        wrong = replica_url.replace(schema, f"{schema}_decoy")
    try:
        with make_store(decoy) as other:
            other.append("s1", [{"type": "send", "id": "u-1", "text": "from the other tables"}])
            other.append("s1", [{"type": "stop"}, {"type": "stop"}])
        store = _replicated(pg_schema, wrong, copy=False)
        try:
            with pytest.warns(Warning, match="is not a copy of the primary") as caught:
                store.append("s1", [{"type": "send", "id": "u-1", "text": "ours"}], expected_version=0)
                assert store.head("s1") == 1  # read your writes: the primary answers
                assert store.load("s1").to_json()["messages"][0]["parts"][0]["text"] == "ours"
            assert "database" in str(caught[0].message) or "schema" in str(caught[0].message)
            assert type(caught[0].message).__name__ == "ReplicaMismatch"
            assert _reads(store)["replica"] == 0
        finally:
            store.close()
    finally:
        if where == "another schema":
            _sql(pg_admin_url(), f'DROP SCHEMA "{schema}_decoy" CASCADE')


def test_a_replica_that_is_a_copy_serves_without_a_warning(
    pg_schema: str, replica_url: str, twin: str, recwarn: pytest.WarningsRecorder
) -> None:
    store = _replicated(pg_schema, replica_url)
    try:
        store.append("s1", [{"type": "send", "id": "u-1", "text": "hi"}], expected_version=0)
        _until_a_replica_serves(store, "s1")
    finally:
        store.close()
    assert not [w for w in recwarn if "not a copy" in str(w.message)]


def test_a_read_right_after_a_write_asks_the_primary_even_while_another_reader_is_asking(
    pg_schema: str, replica_url: str
) -> None:
    # Two readers of one store (the application and the background sealer): the second
    # must not take the position stored before the write because the first is still
    # asking the primary for the new one.
    import threading

    storage = open_storage(pg_schema, replicas=[replica_url])
    try:
        asking, answer = threading.Event(), threading.Event()
        asked = storage.fetch_one

        def fetch_one(query: Any, *args: Any) -> Any:
            if query is storage._q_primary_lsn:
                if threading.current_thread() is not threading.main_thread():
                    asking.set()
                    answer.wait(30)
                    return (1,)
                return (10**12,)
            return asked(query, *args)

        storage.fetch_one = fetch_one  # type: ignore[method-assign]
        storage._moved()  # a write finished
        first = threading.Thread(target=storage._position)
        first.start()
        assert asking.wait(30)
        assert storage._position() == 10**12
        answer.set()
        first.join(30)
        assert storage._position() == 10**12
    finally:
        storage.close()
