"""One EventStore shared by many threads (what a sync web server does), on both backends.

16 threads share one store. Each appends to its own session, appends to two shared
sessions with ``expected_version`` (retrying on ``ConcurrencyError``), loads, and branches
its own session, all at the same time. Afterwards nothing acknowledged is lost or
duplicated, versions are contiguous, every state equals the fold of its events and
``verify`` is clean.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from conftest import make_store
from eventstore import ConcurrencyError, EventStore, SessionNotFound, StorageError
from eventstore.core.reducer import fold_json

THREADS = 16
OWN = 12
SHARED = 6
SHARED_SESSIONS = ("shared-0", "shared-1")

T = TypeVar("T")


def _retrying(call: Callable[[], T]) -> T:
    """``call()``, retried while the database says it is busy (SQLite's single writer)."""
    while True:
        try:
            return call()
        except StorageError as exc:
            if not exc.retryable:
                raise
            time.sleep(0.005)


def _worker(store: EventStore, n: int, acked: dict[str, list[str]], lock: threading.Lock) -> None:
    own = f"own-{n}"
    mine: list[str] = []
    for i in range(OWN):
        msg = f"t{n}-own-{i}"
        r = _retrying(
            lambda msg=msg, i=i: store.append(  # type: ignore[misc]
                own, [{"type": "send", "id": msg, "text": "x"}], expected_version=i
            )
        )
        assert r.version == i + 1
        mine.append(msg)
        if i % 4 == 3:
            # Reads and forks interleaved with everyone else's writes.
            assert len(store.load(own).messages) == i + 1
            assert store.load(own, version=i // 2).to_json() == fold_json(
                None, [{"type": "send", "id": m, "text": "x"} for m in mine[: i // 2]]
            )
            _retrying(lambda i=i: store.branch(own, at=i, new_id=f"{own}-b{i}"))  # type: ignore[misc]
        target = SHARED_SESSIONS[i % 2]
        if i < SHARED:
            shared_msg = f"t{n}-shared-{i}"
            while True:
                try:
                    head = _head(store, target)
                    _retrying(
                        lambda target=target, msg=shared_msg, head=head: store.append(  # type: ignore[misc]
                            target, [{"type": "send", "id": msg, "text": "y"}], expected_version=head
                        )
                    )
                    break
                except ConcurrencyError:
                    continue  # someone else appended first: read the head again
            with lock:
                acked[target].append(shared_msg)
            store.load(target)
    with lock:
        acked[own] = mine


def _head(store: EventStore, session: str) -> int:
    try:
        return store.head(session)
    except SessionNotFound:
        return 0


def test_sixteen_threads_share_one_store(db_url: str) -> None:
    acked: dict[str, list[str]] = {s: [] for s in SHARED_SESSIONS}
    lock = threading.Lock()
    errors: list[BaseException] = []
    # PostgreSQL: a pooled connection per thread; SQLite: one writer at a time, waited for.
    options: dict[str, Any] = {"pool_size": THREADS} if db_url.startswith("postgresql") else {}
    with make_store(db_url, snapshot_every=4, **options) as store:

        def run(n: int) -> None:
            try:
                _worker(store, n, acked, lock)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []

        for session, messages in acked.items():
            events = list(store.history(session))
            assert [e.version for e in events] == list(range(1, len(events) + 1))
            ids = [e.action["id"] for e in events]
            assert sorted(ids) == sorted(messages), session  # nothing lost, nothing twice
            assert len(set(ids)) == len(ids)
        infos = store.sessions()
        branches = [s for s in infos if "-b" in s.id]
        assert len(branches) == THREADS * (OWN // 4)
        for info in infos:
            actions = [e.action for e in store.history(info.id)]
            assert len(actions) == info.head
            assert store.load(info.id).to_json() == fold_json(None, actions), info.id
            for v in range(0, info.head + 1, 3):
                assert store.load(info.id, version=v).to_json() == fold_json(None, actions[:v]), (info.id, v)
        report = store.verify()
        assert report.ok, report.problems
        assert len(report.sessions) == len(infos) == THREADS + len(SHARED_SESSIONS) + len(branches)
