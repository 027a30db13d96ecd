"""Several processes appending at once (multiprocessing, spawn), on both backends.

Appends to one session serialise on that session's row lock (PostgreSQL) or the write
lock (SQLite, waited for through busy_timeout); nothing acknowledged is ever lost and
versions stay contiguous.
"""

from __future__ import annotations

import multiprocessing
import time

import pytest

from conftest import make_store
from eventstore.errors import ConcurrencyError, StorageError
from eventstore import EventStore

WORKERS = 4
APPENDS = 200


def _writer(url: str, session: str, worker: int, n: int, check: bool) -> list[tuple[int, str]]:
    """Append n single-event batches; with `check`, use expected_version and retry on conflict."""
    acked: list[tuple[int, str]] = []
    expected = 0
    with EventStore(url) as store:
        for i in range(n):
            msg_id = f"w{worker}-{i}"
            action = {"type": "send", "id": msg_id, "text": "x"}
            while True:
                try:
                    r = store.append(
                        session, [action], expected_version=expected if check else None
                    )
                except ConcurrencyError as exc:
                    assert check
                    expected = exc.actual
                    continue
                except StorageError as exc:  # a busy database after busy_timeout: retry
                    if not exc.retryable:
                        raise
                    time.sleep(0.01)
                    continue
                acked.append((r.version, msg_id))
                expected = r.version
                break
    return acked


def _run(url: str, sessions: list[str], check: bool) -> list[list[tuple[int, str]]]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(WORKERS) as pool:
        return pool.starmap(
            _writer, [(url, sessions[w], w, APPENDS, check) for w in range(WORKERS)]
        )


def _assert_log(store: EventStore, session: str, acked: list[tuple[int, str]]) -> None:
    events = list(store.history(session))
    assert [e.version for e in events] == list(range(1, len(acked) + 1))
    by_version = {e.version: e.action["id"] for e in events}
    for version, msg_id in acked:
        assert by_version[version] == msg_id  # every acknowledged append is there, as acked
    assert len(set(by_version.values())) == len(events)  # no duplicates
    assert [e.turn for e in events] == list(range(1, len(events) + 1))
    assert store.verify(session).ok


@pytest.mark.slow
def test_writers_with_expected_version_on_one_session(db_url: str) -> None:
    make_store(db_url).close()
    results = _run(db_url, ["shared"] * WORKERS, check=True)
    with EventStore(db_url) as store:
        assert store.head("shared") == WORKERS * APPENDS
        _assert_log(store, "shared", [a for r in results for a in r])


@pytest.mark.slow
def test_writers_without_expected_version(db_url: str) -> None:
    make_store(db_url).close()
    separate = [f"s{w}" for w in range(WORKERS)]
    results = _run(db_url, separate, check=False)
    with EventStore(db_url) as store:
        for session, acked in zip(separate, results):
            assert store.head(session) == APPENDS
            _assert_log(store, session, acked)
    # And blind appends to one session still serialise.
    results = _run(db_url, ["blind"] * WORKERS, check=False)
    with EventStore(db_url) as store:
        _assert_log(store, "blind", [a for r in results for a in r])


def test_more_threads_than_pool_size_append_and_load(pg_schema: str) -> None:
    # PostgreSQL's one-statement appends and loads have pool_size connections of their own;
    # the threads beyond them take the pooled path.
    import threading

    store = make_store(pg_schema, pool_size=1, max_overflow=8)
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def writer(i: int) -> None:
        try:
            start.wait()
            for n in range(40):
                store.append(f"s{i}", [{"type": "send", "id": f"u-{n}", "text": "hi"}])
                assert len(store.load(f"s{i}").to_json()["messages"]) == n + 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        assert [store.head(f"s{i}") for i in range(6)] == [40] * 6
        assert all(store.verify(f"s{i}").ok for i in range(6))
    finally:
        store.close()
