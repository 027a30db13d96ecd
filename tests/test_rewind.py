"""Rewind: a session's id moves back to a version; the line it leaves is kept (both backends,
both twins)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from conftest import make_store
from eventstore import (
    CompactedError,
    ConcurrencyError,
    EventStore,
    InvalidEvent,
    SessionClosed,
    SessionErased,
    SessionNotFound,
    TurnBusy,
    VersionNotFound,
)
from eventstore.core.reducer import fold_json
from eventstore.samples import random_actions

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]


def send(i: int, text: str = "x") -> dict[str, Any]:
    return {"type": "send", "id": f"u-{i}", "text": text}


def _session(store: EventStore, n: int, seed: int, session: str = "s1") -> list[dict[str, Any]]:
    actions = random_actions(random.Random(seed), n)
    for i in range(0, n, 7):
        store.append(session, actions[i : i + 7], event_ids=[f"{session}-e{j}" for j in range(i, min(n, i + 7))])
    return actions


def test_rewind_moves_the_head_and_keeps_the_old_line_byte_for_byte(db_url: str) -> None:
    with make_store(db_url, snapshot_every=5) as store:
        actions = _session(store, 30, seed=1)
        before = list(store.history("s1"))
        state_at = {v: store.load("s1", version=v).to_json() for v in (0, 12, 30)}
        kept = store.rewind("s1", to=12, actor="user:ada", reason="edit")
        assert kept == "s1~1"
        assert store.head("s1") == 12
        assert store.load("s1").to_json() == state_at[12] == fold_json(None, actions[:12])
        # The kept line: the old head, every event unchanged (ids, times, hashes, versions,
        # and the id they were appended to).
        assert store.head(kept) == 30
        assert list(store.history(kept)) == before
        assert store.load(kept).to_json() == state_at[30]
        assert list(store.history("s1")) == before[:12]
        d = store.diff((kept, None), ("s1", None))
        assert d.base is not None and d.base.version == 12
        [line] = store.lines("s1")
        assert (line.id, line.parent, line.fork_version, line.head) == (kept, "s1", 12, 30)
        info = {i.id: i for i in store.sessions()}
        assert info["s1"].parent is None and info["s1"].head == 12
        assert info[kept].closed_at is not None
        # The session goes on from the version it was rewound to; the kept line does not move.
        store.append("s1", [send(99, "edited")])
        assert store.head("s1") == 13 and store.head(kept) == 30
        assert list(store.history(kept)) == before
        with pytest.raises(SessionClosed):
            store.append(kept, [send(100)])
        assert store.verify().ok


def test_rewinds_number_their_lines_and_lines_lists_them_oldest_first(store: EventStore) -> None:
    store.append("s1", [send(i) for i in range(5)])
    assert store.rewind("s1", to=5) is None  # the head: nothing is written
    assert store.lines("s1") == [] and [i.id for i in store.sessions()] == ["s1"]
    assert store.rewind("s1", to=3) == "s1~1"
    store.append("s1", [send(10), send(11)])
    assert store.rewind("s1", to=0) == "s1~2"
    assert store.head("s1") == 0 and store.load("s1").to_json() == fold_json(None, [])
    assert [(i.id, i.fork_version, i.head) for i in store.lines("s1")] == [("s1~1", 3, 5), ("s1~2", 0, 5)]
    assert [e.version for e in store.history("s1~2")] == [1, 2, 3, 4, 5]
    assert [e.event_id for e in store.history("s1~2")][3:] == [e.event_id for e in store.history("s1~2")][3:]
    store.append("s1", [send(20)])
    assert [e.version for e in store.history("s1")] == [1]


def test_rewind_refuses_what_it_must(store: EventStore) -> None:
    store.append("s1", [send(i) for i in range(6)])
    with pytest.raises(SessionNotFound):
        store.rewind("nope", to=0)
    with pytest.raises(VersionNotFound):
        store.rewind("s1", to=7)
    with pytest.raises(VersionNotFound):
        store.rewind("s1", to=-1)  # as load(version=-1)
    with pytest.raises(InvalidEvent):
        store.rewind("s1", to="2")  # type: ignore[arg-type]
    with pytest.raises(InvalidEvent):
        store.rewind("s1", to=2, reason="")
    with pytest.raises(ConcurrencyError):
        store.rewind("s1", to=2, expected_version=5)
    store.compact("s1", upto=3)
    with pytest.raises(CompactedError):
        store.rewind("s1", to=2)
    assert store.head("s1") == 6 and store.lines("s1") == []
    assert store.rewind("s1", to=3, expected_version=6) == "s1~1"
    assert store.load("s1").to_json() == store.load("s1~1", version=3).to_json()
    # A kept line takes no writes, and is not rewound again.
    with pytest.raises(SessionClosed):
        store.rewind("s1~1", to=4)
    store.close_session("s1", reason="done")
    with pytest.raises(SessionClosed):
        store.rewind("s1", to=0)
    # Ids of the kept shape are refused for new sessions.
    for new in ("x~1", "s1~3"):
        with pytest.raises(InvalidEvent):
            store.append(new, [send(0)])
    with pytest.raises(InvalidEvent):
        store.branch("s1", new_id="b~7")
    store.append("x~", [send(0)])  # not digits after it: an ordinary id


def test_a_live_turn_makes_rewind_busy(store: EventStore) -> None:
    store.append("s1", [send(0)])
    with store.turn("s1", send(1)):
        with pytest.raises(TurnBusy):
            store.rewind("s1", to=0)
    assert store.rewind("s1", to=1) == "s1~1"


def test_branches_made_earlier_are_unchanged(store: EventStore) -> None:
    store.append("s1", [send(i) for i in range(8)])
    store.branch("s1", at=6, new_id="b")
    store.append("b", [send(50)])
    b_history = list(store.history("b"))
    b_state = store.load("b").to_json()
    store.rewind("s1", to=2)
    assert list(store.history("b")) == b_history and store.load("b").to_json() == b_state
    info = {i.id: i for i in store.sessions()}
    assert (info["b"].parent, info["b"].fork_version) == ("s1", 6)
    # A branch of the kept line, made after the rewind, names the kept line.
    store.branch("s1~1", at=7, new_id="c")
    assert {i.id: i.parent for i in store.sessions()}["c"] == "s1~1"
    assert store.verify().ok


def test_a_head_cached_by_another_store_never_writes_into_the_kept_line(db_url: str) -> None:
    with make_store(db_url) as a, make_store(db_url) as b:
        a.append("s1", [send(0), send(1), send(2)])  # `a` caches the head it left
        assert b.rewind("s1", to=1) == "s1~1"
        result = a.append("s1", [send(3)])
        assert (result.first_version, result.version) == (2, 2)
        assert a.head("s1~1") == 3 and [e.version for e in a.history("s1")] == [1, 2]


def test_erasing_a_rewound_session_erases_its_kept_lines(store: EventStore, backend: str) -> None:
    store.append("s1", [send(i) for i in range(4)])
    store.rewind("s1", to=2)
    store.append("other", [send(0)])
    erased = store.erase("s1", reason="gdpr")
    assert set(erased) == {"s1", "s1~1"}
    for gone in ("s1", "s1~1"):
        with pytest.raises(SessionErased):
            store.load(gone)
    assert [i.id for i in store.sessions()] == ["other"]
    report = store.verify()
    assert report.ok and {n.kind for n in report.notices} == {"erased", "rewound"}


def test_compaction_of_either_line_keeps_both_loadable(store: EventStore) -> None:
    actions = [send(i) for i in range(10)]
    store.append("s1", actions)
    store.rewind("s1", to=6)
    store.append("s1", [send(20), send(21)])
    kept_state = store.load("s1~1").to_json()
    store.compact("s1~1", upto=9)
    store.compact("s1", upto=7)
    assert store.load("s1~1").to_json() == kept_state
    assert store.load("s1").to_json() == fold_json(None, [*actions[:6], send(20), send(21)])
    with pytest.raises(CompactedError):
        store.rewind("s1", to=6)
    assert store.verify().ok


def test_verify_reports_each_rewind(store: EventStore) -> None:
    store.append("s1", [send(i) for i in range(4)])
    store.rewind("s1", to=1, actor="user:ada", reason="regenerate")
    report = store.verify()
    assert report.ok
    [notice] = report.notices
    assert (notice.session, notice.kind, notice.version) == ("s1", "rewound", 1)
    assert "user:ada" in notice.message and "regenerate" in notice.message and "s1~1" in notice.message
    assert [n.kind for n in store.verify("s1~1").notices] == ["rewound"]

