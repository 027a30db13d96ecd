"""The one-statement load path (``Storage.load_parts``) against the general one (``_state_at``).

``EventStore.load`` of a root session reads the session row, the newest usable snapshot,
its message bodies and the tail in one statement (PostgreSQL) or one read transaction
(SQLite); branches take the general path. Both must give the same state for every
version, refuse the same bad versions, and fail loudly on a missing blob.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from conftest import make_store
from sqlalchemy import Engine, text

import eventstore.store as store_mod
from eventstore.errors import SessionNotFound, StorageError, VersionNotFound
from eventstore.reducer import fold_json
from eventstore.samples import chat_session, random_actions
from eventstore.store import EventStore


def _general(store: EventStore, session: str, version: int) -> dict[str, Any]:
    with store._storage.read() as tx:
        row = store._storage.get_session(tx, session)
        assert row is not None
        return store._state_at(tx, row, version)


@pytest.mark.parametrize("every", [1, 5, 64])
def test_every_version_matches_the_fold_and_the_general_path(db_url: str, every: int) -> None:
    actions = random_actions(random.Random(every), 60)
    with make_store(db_url, snapshot_every=every) as store:
        store.append("s", actions[:25])
        store.append("s", actions[25:])
        for v in range(61):
            got = store.load("s", v).to_json()
            assert got == fold_json(None, actions[:v]), v
            assert got == _general(store, "s", v), v
        assert store.load("s").to_json() == fold_json(None, actions)


def test_chat_session_with_repeated_messages(db_url: str) -> None:
    # The same message twice in a state has one blob and two digests: both come back.
    actions = chat_session(3, seed=1)
    with make_store(db_url, snapshot_every=16) as store:
        store.append("a", actions)
        store.append("b", actions)  # identical states: every blob shared with "a"
        expected = fold_json(None, actions)
        assert store.load("a").to_json() == expected
        assert store.load("b").to_json() == expected


def test_another_reducer_version_ignores_the_snapshots(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    actions = random_actions(random.Random(3), 40)
    with make_store(db_url, snapshot_every=4) as store:
        store.append("s", actions)
        monkeypatch.setattr(store_mod, "REDUCER_VERSION", 999)
        for v in (1, 4, 17, 40):
            assert store.load("s", v).to_json() == fold_json(None, actions[:v])


def test_bad_sessions_and_versions(store: EventStore) -> None:
    store.append("s", random_actions(random.Random(4), 5))
    with pytest.raises(SessionNotFound):
        store.load("nope")
    for bad in (6, -1, True, 2**40, 2**31, "3"):
        with pytest.raises(VersionNotFound):
            store.load("s", bad)  # type: ignore[arg-type]
    assert store.load("s", 0).to_json() == fold_json(None, ())


def test_branch_loads_take_the_general_path(db_url: str) -> None:
    actions = random_actions(random.Random(5), 30)
    with make_store(db_url, snapshot_every=4) as store:
        store.append("root", actions[:20])
        store.branch("root", at=10, new_id="kid")
        store.append("kid", actions[20:], expected_version=10)
        lineage = actions[:10] + actions[20:]
        for v in range(21):
            assert store.load("kid", v).to_json() == fold_json(None, lineage[:v]), v
        assert store.load("kid").to_json() == fold_json(None, lineage)


def test_a_missing_blob_is_a_storage_error(db_url: str, raw_engine: Engine) -> None:
    actions = chat_session(2, seed=2)
    with make_store(db_url, snapshot_every=8) as store:
        store.append("s", actions)
        store.branch("s", new_id="kid")
        with raw_engine.begin() as conn:
            conn.execute(text("DELETE FROM snapshot_blobs"))
        with pytest.raises(StorageError, match="missing message blob"):
            store.load("s")
        with pytest.raises(StorageError, match="missing message blob"):
            store.load("kid")
