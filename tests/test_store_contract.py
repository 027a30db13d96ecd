"""The store contract (issue 3), on SQLite and PostgreSQL alike."""

from __future__ import annotations

import random
import sys
from datetime import timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import text

import conftest
import eventstore
from conftest import BACKENDS, PARTITIONED, make_store
from eventstore.errors import (
    ConcurrencyError,
    EventIdConflict,
    InvalidEvent,
    SchemaError,
    SessionNotFound,
    StorageError,
    VersionNotFound,
)
from eventstore.core.reducer import REDUCER_VERSION, fold_json
from eventstore.samples import random_actions
from eventstore import EventStore
from eventstore.engine import engine as engine_module
from eventstore.engine import sealer
from eventstore.core import appends as planning_module
from eventstore.features import integrity

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin", "sealing")]

SEND = {"type": "send", "id": "u-1", "text": "hello"}


@pytest.fixture(params=["off", "always"])
def sealing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, twin: str) -> str:
    """The contract holds with sealing off, and with every closed turn sealed right after
    each append (``store.seal()``; background sealing, the default, runs everywhere else)."""
    mode = str(request.param)
    module = sys.modules[__name__]
    opened, made = module.EventStore, module.make_store

    def unsealed(url: str, **options: Any) -> Any:
        return opened(url, **{"seal": False, **options})

    def made_unsealed(url: str, **options: Any) -> Any:
        return made(url, **{"seal": False, **options})

    monkeypatch.setattr(module, "EventStore", unsealed)
    monkeypatch.setattr(module, "make_store", made_unsealed)
    monkeypatch.setattr(conftest, "make_store", made_unsealed)  # the `store` fixture's
    if mode == "always":
        store_class = eventstore.EventStore
        append = store_class.append

        def append_then_seal(self: EventStore, *args: Any, **kwargs: Any) -> Any:
            result = append(self, *args, **kwargs)
            self.seal()
            return result

        monkeypatch.setattr(store_class, "append", append_then_seal)
        async_append = eventstore.AsyncEventStore.append

        async def async_append_then_seal(self: eventstore.AsyncEventStore, *args: Any, **kwargs: Any) -> Any:
            result = await async_append(self, *args, **kwargs)
            await self.seal()
            return result

        monkeypatch.setattr(eventstore.AsyncEventStore, "append", async_append_then_seal)
    return mode


@pytest.fixture(params=[*BACKENDS, PARTITIONED])
def backend(request: pytest.FixtureRequest) -> str:
    """This suite also runs on the session-partitioned PostgreSQL schema."""
    return str(request.param)


def _append_in_batches(
    store: EventStore, session: str, actions: list[dict[str, Any]], seed: int
) -> None:
    rng = random.Random(seed)
    i = 0
    while i < len(actions):
        n = rng.randint(1, 17)
        r = store.append(session, actions[i : i + n], expected_version=i)
        assert r.version == min(len(actions), i + n)
        i += n


def _snapshot(store: EventStore, session: str) -> tuple[int, list[dict[str, Any]]]:
    return store.head(session), [e.to_json() for e in store.history(session)]


@pytest.mark.parametrize("snapshot_every", [7, 1000])
def test_every_version_loads_the_fold_of_its_prefix(db_url: str, snapshot_every: int) -> None:
    actions = random_actions(random.Random(snapshot_every), 200)
    prefix_states = [fold_json(None, actions[:v]) for v in range(len(actions) + 1)]
    with make_store(db_url, snapshot_every=snapshot_every) as store:
        _append_in_batches(store, "s1", actions, seed=1)
        assert store.head("s1") == 200
        for v, expected in enumerate(prefix_states):
            assert store.load("s1", version=v).to_json() == expected, f"version {v}"
        assert store.load("s1").to_json() == prefix_states[-1]
    # A new store (no warm cache, new connections) sees exactly the same.
    with EventStore(db_url, snapshot_every=snapshot_every) as again:
        for v, expected in enumerate(prefix_states):
            assert again.load("s1", version=v).to_json() == expected, f"version {v} after reopen"
        assert again.verify("s1").ok


def test_snapshot_every_does_not_change_what_loads(db_url: str) -> None:
    actions = random_actions(random.Random(3), 120)
    with make_store(db_url, snapshot_every=5) as store:
        _append_in_batches(store, "s1", actions, seed=2)
    # Read back with another cadence: snapshots written at 5s still serve correctly.
    with EventStore(db_url, snapshot_every=64) as other:
        for v in range(0, 121, 3):
            assert other.load("s1", version=v).to_json() == fold_json(None, actions[:v])


def test_append_records_versions_turns_and_envelope(store: EventStore) -> None:
    r1 = store.append("s1", [SEND, {"type": "stop"}], actor="alice", metadata={"k": [1, 2]})
    assert (r1.session, r1.first_version, r1.version, r1.count) == ("s1", 1, 2, 2)
    assert r1.recorded_at.tzinfo is not None and r1.recorded_at.utcoffset() == timedelta(0)
    r2 = store.append("s1", [{"type": "send", "id": "u-2", "text": "x"}], event_ids=["e-3"])
    assert (r2.first_version, r2.version, r2.event_ids) == (3, 3, ("e-3",))
    events = list(store.history("s1"))
    assert [e.version for e in events] == [1, 2, 3]
    assert [e.turn for e in events] == [1, 1, 2]
    assert [e.type for e in events] == ["send", "stop", "send"]
    assert events[0].action == SEND
    assert events[0].actor == "alice" and events[0].metadata == {"k": [1, 2]}
    assert events[2].actor is None and events[2].metadata is None
    assert [e.event_id for e in events] == [None, None, "e-3"]
    assert events[0].recorded_at == r1.recorded_at == events[1].recorded_at
    assert events[0].recorded_at.tzinfo == timezone.utc
    assert all(len(e.hash) == 64 for e in events) and len({e.hash for e in events}) == 3
    j = events[0].to_json()
    assert j["session"] == "s1" and j["recorded_at"].endswith("Z") and j["hash"] == events[0].hash


def test_expected_version_conflicts_raise_and_write_nothing(store: EventStore) -> None:
    store.append("s1", [SEND, {"type": "stop"}], expected_version=0)
    before = _snapshot(store, "s1")
    with pytest.raises(ConcurrencyError) as err:
        store.append("s1", [{"type": "retry"}], expected_version=1)
    assert (err.value.session, err.value.expected, err.value.actual) == ("s1", 1, 2)
    with pytest.raises(ConcurrencyError) as err:
        store.append("s1", [{"type": "retry"}], expected_version=0)
    assert (err.value.expected, err.value.actual) == (0, 2)
    assert "already exists" in str(err.value)
    assert _snapshot(store, "s1") == before
    # A missing session with expected n > 0: conflict, and the session is not created.
    with pytest.raises(ConcurrencyError) as err:
        store.append("new", [SEND], expected_version=3)
    assert (err.value.expected, err.value.actual) == (3, 0)
    with pytest.raises(SessionNotFound):
        store.head("new")
    assert store.append("s1", [{"type": "retry"}], expected_version=2).version == 3


def test_idempotent_retry_returns_the_original_and_writes_nothing(store: EventStore) -> None:
    batch = [SEND, {"type": "stop"}]
    first = store.append("s1", batch, expected_version=0, event_ids=["a", "b"], actor="bot")
    store.append("s1", [{"type": "retry"}], event_ids=["c"])
    before = _snapshot(store, "s1")
    again = store.append("s1", batch, expected_version=0, event_ids=["a", "b"], actor="bot")
    assert again == first and again.replayed and not first.replayed
    assert _snapshot(store, "s1") == before
    # The retry of the last batch, and a retry without expected_version, too.
    assert store.append("s1", [{"type": "retry"}], event_ids=["c"]).version == 3
    assert _snapshot(store, "s1") == before


def test_same_event_id_with_other_content_raises(store: EventStore) -> None:
    store.append("s1", [SEND, {"type": "stop"}], event_ids=["a", "b"], metadata={"m": 1})
    before = _snapshot(store, "s1")
    with pytest.raises(EventIdConflict) as err:
        store.append("s1", [SEND, {"type": "retry"}], event_ids=["a", "b"], metadata={"m": 1})
    assert (err.value.event_id, err.value.version) == ("b", 2)
    with pytest.raises(EventIdConflict):
        store.append("s1", [SEND, {"type": "stop"}], event_ids=["a", "b"], actor="other")
    with pytest.raises(EventIdConflict):
        store.append("s1", [SEND, {"type": "stop"}], event_ids=["a", "b"], metadata={"m": 2})
    with pytest.raises(InvalidEvent):  # partly recorded: not a retry of one batch
        store.append(
            "s1", [{"type": "stop"}, {"type": "retry"}], event_ids=["b", "z"], metadata={"m": 1}
        )
    assert _snapshot(store, "s1") == before


def test_invalid_actions_raise_and_write_nothing(store: EventStore) -> None:
    store.append("s1", [SEND])
    before = _snapshot(store, "s1")
    with pytest.raises(InvalidEvent) as err:
        store.append("s1", [{"type": "stop"}, {"type": "send", "id": "u-2"}])
    assert err.value.index == 1
    with pytest.raises(InvalidEvent):
        store.append("s1", [{"type": "nonsense"}])
    with pytest.raises(InvalidEvent):
        store.append("s1", [])
    with pytest.raises(InvalidEvent):
        store.append("s1", ["not an object"])  # type: ignore[list-item]
    assert _snapshot(store, "s1") == before
    with pytest.raises(InvalidEvent):
        store.append("fresh", [{"type": "part", "part": {"type": "text-delta"}}])
    with pytest.raises(SessionNotFound):
        store.head("fresh")


def test_limits_on_sizes_and_ids(db_url: str) -> None:
    with make_store(db_url, max_event_bytes=200, max_id_length=8) as store:
        store.append("s1", [SEND])
        before = _snapshot(store, "s1")
        big = {"type": "send", "id": "u", "text": "x" * 300}
        with pytest.raises(InvalidEvent, match="max_event_bytes"):
            store.append("s1", [SEND, big])
        with pytest.raises(InvalidEvent, match="max_event_bytes"):
            store.append("s1", [SEND], metadata={"blob": "y" * 300})
        for bad in ["", "x" * 9, "a\x00b", "tab\there", 7]:
            with pytest.raises(InvalidEvent):
                store.append(bad, [SEND])  # type: ignore[arg-type]
        with pytest.raises(InvalidEvent):
            store.append("s1", [SEND], event_ids=["ok", "extra"])
        with pytest.raises(InvalidEvent):
            store.append("s1", [SEND, SEND], event_ids=["dup", "dup"])
        with pytest.raises(InvalidEvent):
            store.append("s1", [SEND], event_ids=["123456789"])
        with pytest.raises(InvalidEvent):
            store.append("s1", [SEND], event_ids="e")  # type: ignore[arg-type]
        with pytest.raises(InvalidEvent):
            store.append("s1", [SEND], actor="far-too-long")
        with pytest.raises(InvalidEvent, match="metadata"):
            store.append("s1", [SEND], metadata=[1, 2])  # type: ignore[arg-type]
        with pytest.raises(InvalidEvent):
            store.append("s1", [SEND], expected_version=-1)
        assert _snapshot(store, "s1") == before
    with pytest.raises(InvalidEvent):
        EventStore(db_url, snapshot_every=0)


def test_unicode_and_nul_survive_the_round_trip(store: EventStore) -> None:
    weird = {"type": "send", "id": "ü-\u0000-1", "text": "nul \u0000 emoji 🫖 \u2028"}
    store.append("sé ssion", [weird], event_ids=["é"], actor="ä", metadata={"n": "\u0000"})
    (e,) = store.history("sé ssion")
    assert e.action == weird and e.event_id == "é" and e.metadata == {"n": "\u0000"}
    assert store.load("sé ssion").messages[0]["id"] == "ü-\u0000-1"
    assert store.verify("sé ssion").ok


def test_history_bounds(store: EventStore) -> None:
    actions = random_actions(random.Random(5), 30)
    store.append("s1", actions)
    versions = lambda **kw: [e.version for e in store.history("s1", **kw)]  # noqa: E731
    assert versions() == list(range(1, 31))
    assert versions(after=10) == list(range(11, 31))
    assert versions(upto=5) == [1, 2, 3, 4, 5]
    assert versions(after=3, upto=7) == [4, 5, 6, 7]
    assert versions(limit=4) == [1, 2, 3, 4]
    assert versions(desc=True) == list(range(30, 0, -1))
    assert versions(desc=True, limit=3) == [30, 29, 28]
    assert versions(after=25, desc=True) == [30, 29, 28, 27, 26]
    assert versions(upto=100) == list(range(1, 31))
    assert versions(after=30) == [] and versions(limit=0) == []
    assert [e.action for e in store.history("s1")] == actions
    with pytest.raises(SessionNotFound):
        store.history("missing")


def test_history_streams_long_sessions_in_chunks(store: EventStore) -> None:
    actions = random_actions(random.Random(6), 2500)
    store.append("s1", actions)
    it = store.history("s1")
    first = next(it)
    assert first.version == 1
    assert sum(1 for _ in it) == 2499
    assert [e.version for e in store.history("s1", after=990, upto=1010, desc=True)] == list(
        range(1010, 990, -1)
    )


def test_missing_sessions_and_versions(store: EventStore) -> None:
    with pytest.raises(SessionNotFound, match="'nope'"):
        store.head("nope")
    with pytest.raises(SessionNotFound):
        store.load("nope")
    store.append("s1", [SEND, {"type": "stop"}])
    for bad in (3, -1, 100):
        with pytest.raises(VersionNotFound) as err:
            store.load("s1", version=bad)
        assert err.value.head == 2 and err.value.version == bad
    assert store.load("s1", version=0).to_json() == {"messages": [], "status": "idle"}


def test_sessions_lists_roots_and_branches(store: EventStore) -> None:
    store.append("a", [SEND])
    store.append("b", [SEND, {"type": "stop"}])
    store.branch("b", at=1, new_id="b-alt")
    infos = {s.id: s for s in store.sessions()}
    assert set(infos) == {"a", "b", "b-alt"}
    assert (infos["b"].head, infos["b"].parent, infos["b"].baseline) == (2, None, 0)
    assert (infos["b-alt"].parent, infos["b-alt"].fork_version, infos["b-alt"].head) == ("b", 1, 1)
    assert infos["a"].created_at.tzinfo is not None
    assert infos["b-alt"].to_json()["parent"] == "b"


def test_snapshots_of_another_reducer_version_are_never_served(
    db_url: str, raw_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    actions = random_actions(random.Random(8), 60)
    with make_store(db_url, snapshot_every=10) as store:
        store.append("s1", actions)
    # Forge every snapshot into an old reducer's, with a visibly wrong state.
    with raw_engine.begin() as conn:
        stored = conn.execute(text("SELECT count(*) FROM snapshots")).scalar_one()
        n = conn.execute(
            text("UPDATE snapshots SET reducer_version = :old, rest = :rest"),
            {"old": REDUCER_VERSION - 1, "rest": b'{"status":"error"}'},
        ).rowcount
    # Six, or fewer once sealing has thinned those inside sealed turns.
    assert n == stored and 0 < n <= 6
    with EventStore(db_url, snapshot_every=10) as store:
        for v in (10, 35, 60):
            assert store.load("s1", version=v).to_json() == fold_json(None, actions[:v])
    # And the other way round: a newer reducer ignores snapshots of the current one.
    with raw_engine.begin() as conn:
        conn.execute(text("UPDATE snapshots SET reducer_version = :v"), {"v": REDUCER_VERSION})
    monkeypatch.setattr(engine_module, "REDUCER_VERSION", REDUCER_VERSION + 1)
    monkeypatch.setattr(integrity, "REDUCER_VERSION", REDUCER_VERSION + 1)
    with EventStore(db_url, snapshot_every=10) as store:
        assert store.load("s1", version=60).to_json() == fold_json(None, actions)
        assert store.verify("s1").ok  # stale snapshots are not this reducer's to check


def test_a_load_folds_fewer_than_snapshot_every_events(
    db_url: str, monkeypatch: pytest.MonkeyPatch, sealing: str
) -> None:
    # Inside sealed turns one snapshot in SEALED_SNAPSHOT_SPACING is kept.
    bound = 16 * (1 if sealing == "off" else sealer.SEALED_SNAPSHOT_SPACING)
    actions = random_actions(random.Random(9), 150)
    folded: list[int] = []
    real = planning_module.fold_json

    def counting(state: Any, acts: Any) -> Any:
        acts = list(acts)
        folded.append(len(acts))
        return real(state, acts)

    with make_store(db_url, snapshot_every=16) as store:
        _append_in_batches(store, "s1", actions, seed=3)
        monkeypatch.setattr(planning_module, "fold_json", counting)
        for v in range(151):
            folded.clear()
            store.load("s1", version=v)
            assert sum(folded) < bound, f"version {v} folded {sum(folded)} events"


def test_not_migrated_database_says_run_migrate(db_url: str) -> None:
    with EventStore(db_url) as store:
        with pytest.raises(SchemaError, match="eventstore migrate"):
            store.append("s1", [SEND])
        with pytest.raises(SchemaError, match="eventstore migrate"):
            store.check_schema()
        with pytest.raises(SchemaError):
            store.sessions()
        store.migrate()
        store.check_schema()
        assert store.append("s1", [SEND]).version == 1


def test_unreachable_database_is_a_retryable_storage_error_without_password() -> None:
    store = EventStore("postgresql+psycopg://user:s3cret@127.0.0.1:1/nowhere?connect_timeout=2")
    assert "s3cret" not in store.url and "s3cret" not in repr(store)
    with pytest.raises(StorageError) as err:
        store.head("s1")
    assert err.value.retryable
    assert "s3cret" not in str(err.value)
    assert err.value.__cause__ is not None
    store.close()
    with pytest.raises(StorageError):
        EventStore("mysql://x@localhost/db")
    with pytest.raises(StorageError):
        EventStore("not a url")


def test_two_writers_interleaving_keep_versions_and_snapshots_right(db_url: str, sealing: str) -> None:
    """Each store guesses the head from its own last append; the other's appends prove it wrong."""
    actions = random_actions(random.Random(12), 120)
    with make_store(db_url, snapshot_every=5) as a, EventStore(db_url, snapshot_every=5) as b:
        rng = random.Random(4)
        i = 0
        while i < len(actions):
            writer = a if rng.random() < 0.5 else b
            n = rng.randint(1, 9)
            r = writer.append("s1", actions[i : i + n])
            assert (r.first_version, r.version) == (i + 1, min(i + n, len(actions)))
            i += n
        for store in (a, b):
            for v in range(0, 121, 7):
                assert store.load("s1", version=v).to_json() == fold_json(None, actions[:v])
        report = a.verify("s1")
        assert report.ok, report.problems
        # One every 5 versions; inside sealed turns one in two (those at multiples of 10) stay.
        assert report.snapshots == 24 if sealing == "off" else 12 <= report.snapshots < 24


def test_two_single_event_writers_catch_each_others_appends(db_url: str) -> None:
    """One event per append and no snapshot due: PostgreSQL's scalar one-event statement."""
    actions = random_actions(random.Random(13), 60)
    with make_store(db_url, snapshot_every=1000) as a, EventStore(db_url) as b:
        rng = random.Random(5)
        for i, action in enumerate(actions, 1):
            writer = a if rng.random() < 0.5 else b
            assert writer.append("s1", [action], actor="w").version == i
        assert [e.version for e in a.history("s1")] == list(range(1, 61))
        assert a.load("s1").to_json() == b.load("s1").to_json() == fold_json(None, actions)
        assert a.verify("s1").ok


def test_the_one_statement_append_leaves_pooled_connections_transactional(pg_schema: str) -> None:
    """PostgreSQL's fast path runs in autocommit; the pool must hand out normal connections after."""
    make_store(pg_schema).close()
    engine = engine_module.Engine(pg_schema, pool_size=1)
    try:
        for _ in range(3):
            engine.append("s1", [SEND])
        with engine.storage.engine.connect() as conn:  # type: ignore[attr-defined]
            assert conn.connection.driver_connection.autocommit is False
        engine.branch("s1", at=1, new_id="b")  # a locked, multi-statement transaction still works
        assert engine.head("b") == 1 and integrity.verify(engine).ok
    finally:
        engine.close()


def test_a_busy_sqlite_file_is_a_retryable_storage_error_after_busy_timeout(tmp_path: Any) -> None:
    import sqlite3
    import time

    path = tmp_path / "busy.db"
    with make_store(f"sqlite:///{path}", busy_timeout_ms=200) as store:
        store.append("s1", [SEND])
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            t0 = time.perf_counter()
            with pytest.raises(StorageError) as err:
                store.append("s1", [SEND])
            assert time.perf_counter() - t0 >= 0.15  # it waited through busy_timeout first
            assert err.value.retryable and "try again" in str(err.value)
            assert store.head("s1") == 1  # reads are not blocked by a writer (WAL)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.append("s1", [SEND]).version == 2
